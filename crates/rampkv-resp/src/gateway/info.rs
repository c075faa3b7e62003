//! INFO: the sections operators read, from what this gateway can actually know.
//!
//! # Contract
//! Every value is read when INFO runs, from a real source, or left out: the gateway's own
//! counters and process (`/proc/self/status`, `/proc/meminfo` on Linux), the cluster file it
//! was started with, and, when the servers run in this process (`rampkv local`,
//! [`InProcessServers`](super::InProcessServers)), their stores, logs and replication links.
//! A gateway over TCP (`rampkv gateway`) has only the network, and the servers' wire protocol
//! carries no statistics, so what only the servers know is shown as unknown, not guessed.
//! docs/resp.md ("INFO") says where each field comes from and when it is missing.
//!
//! # Layout of the text
//! Redis's: sections in Redis's order, each a `# Title` line and `name:value` lines, separated
//! by one blank line, every line ending in CRLF; rampkv's own fields start with `rampkv_`.
//! `INFO` alone, `default`, `all` and `everything` give every section; unknown names nothing.

use std::time::{SystemTime, UNIX_EPOCH};

use super::event_loop::EventLoop;
use super::INFO_PARTITION_LINES_MAX;
use crate::command::{InfoSection, InfoSections};
use crate::REDIS_COMPATIBLE_VERSION;
use rampkv_config::configuration::{backups_of, ServerId};
use rampkv_net::server::Served;

impl EventLoop {
    /// INFO's text for `sections`; `keys`: the count of live keys, if it was taken.
    pub(super) fn info_text(&self, sections: InfoSections, keys: Option<u64>) -> Vec<u8> {
        let mut text = String::new();
        for section in InfoSection::ALL.into_iter().filter(|section| sections.contains(*section)) {
            if !text.is_empty() {
                text.push_str("\r\n");
            }
            let name = section.name();
            text.push_str("# ");
            text.push_str(&name[..1].to_ascii_uppercase());
            text.push_str(&name[1..]);
            text.push_str("\r\n");
            let lines = match section {
                InfoSection::Server => self.server_info(),
                InfoSection::Clients => self.clients_info(),
                InfoSection::Memory => self.memory_info(),
                InfoSection::Persistence => self.persistence_info(),
                InfoSection::Stats => self.stats_info(),
                InfoSection::Replication => self.replication_info(),
                InfoSection::Cluster => vec!["cluster_enabled:0".to_string()],
                InfoSection::Keyspace => keyspace_info(keys),
            };
            for line in lines {
                debug_assert!(line.contains(':') && !line.contains('\r') && !line.contains('\n'), "{line}");
                text.push_str(&line);
                text.push_str("\r\n");
            }
        }
        text.into_bytes()
    }

    /// The servers of this process, in cluster order (none over TCP).
    fn in_process_served(&self) -> impl Iterator<Item = &Served> {
        self.in_process.iter().flat_map(|servers| servers.groups.iter()).flat_map(|group| group.served())
    }

    fn server_info(&self) -> Vec<String> {
        let uptime = self.stats.started.elapsed().as_secs();
        let now_us = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_micros());
        let mut lines = vec![
            format!("redis_version:{REDIS_COMPATIBLE_VERSION}"),
            format!("rampkv_version:{}", env!("CARGO_PKG_VERSION")),
            "redis_mode:standalone".to_string(),
            format!("os:{} {}", std::env::consts::OS, std::env::consts::ARCH),
            format!("arch_bits:{}", usize::BITS),
        ];
        if cfg!(target_os = "linux") {
            lines.push("multiplexing_api:epoll".to_string()); // mio's poller on Linux
        }
        lines.extend([
            format!("process_id:{}", std::process::id()),
            format!("tcp_port:{}", self.stats.port),
            format!("server_time_usec:{now_us}"),
            format!("uptime_in_seconds:{uptime}"),
            format!("uptime_in_days:{}", uptime / 86_400),
        ]);
        if let Ok(path) = std::env::current_exe() {
            lines.push(format!("executable:{}", path.display()));
        }
        let gateway = if self.in_process.is_some() { "in_process" } else { "tcp" };
        lines.extend([
            format!("rampkv_gateway:{gateway}"),
            format!("rampkv_servers:{}", self.cluster.servers().len()),
            format!("rampkv_partitions:{}", self.cluster.partition_count()),
        ]);
        // How the gateway reaches its servers (its driver's transport), and this process's
        // fabric (what `--fabric` chose and what it can do; the servers' in `rampkv local`).
        let media = if self.in_process.is_some() { "in_process" } else { "tcp" };
        lines.push(format!("rampkv_media:{media}"));
        if let Some(fabric) = rampkv_net::message::fabric::fabric_summary() {
            lines.push(format!("rampkv_fabric:{}", fabric.replace(['\r', '\n'], " ")));
        }
        lines
    }

    fn clients_info(&self) -> Vec<String> {
        let open = || self.connections.iter().flatten();
        vec![
            format!("connected_clients:{}", open().count()),
            format!("maxclients:{}", self.stats.sessions),
            // The gateway has no blocking command and no client-side caching.
            "blocked_clients:0".to_string(),
            "tracking_clients:0".to_string(),
            format!("rampkv_clients_in_multi:{}", open().filter(|connection| connection.multi.is_some()).count()),
        ]
    }

    fn memory_info(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(rss) = proc_bytes("/proc/self/status", "VmRSS:") {
            lines.push(format!("used_memory_rss:{rss}"));
            lines.push(format!("used_memory_rss_human:{}", bytes_human(rss)));
        }
        if let Some(total) = proc_bytes("/proc/meminfo", "MemTotal:") {
            lines.push(format!("total_system_memory:{total}"));
            lines.push(format!("total_system_memory_human:{}", bytes_human(total)));
        }
        // rampkv has no memory limit and never evicts a key.
        lines.extend(["maxmemory:0", "maxmemory_human:0B", "maxmemory_policy:noeviction"].map(String::from));
        lines.push(format!("rampkv_rss_includes_servers:{}", u8::from(self.in_process.is_some())));
        if self.in_process.is_some() {
            // The primaries' stores: the backups' copies live in the group's backup services,
            // which the gateway is not given.
            let (mut keys, mut versions, mut value_bytes) = (0, 0, 0);
            for served in self.in_process_served() {
                let stats = served.core.store().stats();
                keys += stats.keys;
                versions += stats.versions;
                value_bytes += stats.value_bytes as u64;
            }
            lines.push(format!("rampkv_store_keys:{keys}"));
            lines.push(format!("rampkv_store_versions:{versions}"));
            lines.push(format!("rampkv_store_value_bytes:{value_bytes}"));
            lines.push(format!("rampkv_store_value_bytes_human:{}", bytes_human(value_bytes)));
        }
        lines
    }

    fn persistence_info(&self) -> Vec<String> {
        // A rampkv server listens only once it has recovered its data, so none the gateway
        // talks to is loading.
        let mut lines = vec!["loading:0".to_string()];
        if self.in_process.is_none() {
            lines.push("rampkv_persistence:unknown".to_string());
            return lines;
        }
        let journals: Vec<_> = self.in_process_served().filter_map(Served::journal).collect();
        if journals.is_empty() {
            lines.extend(["aof_enabled:0", "rampkv_persistence:none"].map(String::from));
            return lines;
        }
        let mut policies: Vec<&str> = journals.iter().map(|journal| journal.policy().name()).collect();
        policies.sort_unstable();
        policies.dedup();
        let failed = journals.iter().any(|journal| journal.failure().is_some());
        let (mut records, mut bytes, mut fsyncs, mut snapshots) = (0, 0, 0, 0);
        for journal in &journals {
            let stats = journal.stats();
            records += stats.log.records;
            bytes += stats.log.bytes;
            fsyncs += stats.log.fsyncs;
            snapshots += stats.snapshots_written;
        }
        lines.extend([
            "aof_enabled:1".to_string(),
            "rampkv_persistence:log".to_string(),
            format!("rampkv_appendfsync:{}", policies.join("|")),
            format!("aof_last_write_status:{}", if failed { "err" } else { "ok" }),
            format!("rampkv_log_records:{records}"),
            format!("rampkv_log_bytes:{bytes}"),
            format!("rampkv_log_fsyncs:{fsyncs}"),
            format!("rampkv_snapshots_written:{snapshots}"),
        ]);
        lines
    }

    fn stats_info(&self) -> Vec<String> {
        vec![
            format!("total_connections_received:{}", self.stats.connections_received),
            format!("total_commands_processed:{}", self.stats.commands_processed),
            format!("rejected_connections:{}", self.stats.connections_rejected),
        ]
    }

    /// The gateway is no Redis replica and has none (`role:master`, as HELLO says); rampkv's
    /// own replication is per partition: where each partition's primary and backups are, from
    /// the cluster file's placement, and with in-process servers their links' latencies.
    fn replication_info(&self) -> Vec<String> {
        let cluster = &self.cluster;
        let servers = cluster.servers();
        let replicas = cluster.replicas();
        let mut lines = vec![
            "role:master".to_string(),
            "connected_slaves:0".to_string(),
            format!("rampkv_replicas:{replicas}"),
            format!("rampkv_replication:{}", if replicas > 1 { "synchronous" } else { "none" }),
            // In-process servers (`rampkv local`) never fail over: the cluster file's placement
            // is theirs. A gateway over TCP shows the first configuration's (module docs).
            format!(
                "rampkv_placement_source:{}",
                if self.in_process.is_some() { "in_process_servers" } else { "cluster_file" }
            ),
        ];
        let partitions = cluster.partition_count();
        for partition in 0..partitions.min(INFO_PARTITION_LINES_MAX) {
            let Some(owner) = cluster.owner_of_partition(partition) else { break };
            let mut line = format!("rampkv_partition{partition}:primary={}", servers[owner]);
            if replicas > 1 {
                let backups = backups_of(owner as ServerId, servers.len(), replicas);
                let addresses: Vec<&str> =
                    backups.iter().map(|backup| servers[usize::from(*backup)].as_str()).collect();
                line.push_str(&format!(",backups={}", addresses.join("|")));
            }
            lines.push(line);
        }
        if partitions > INFO_PARTITION_LINES_MAX {
            lines.push(format!("rampkv_partition_lines_omitted:{}", partitions - INFO_PARTITION_LINES_MAX));
        }
        for (index, served) in self.in_process_served().enumerate() {
            let Some(replicator) = served.replicator() else { continue };
            let stats = replicator.stats();
            lines.push(format!(
                "rampkv_server{index}:address={},ack_latency_us_mean={:.1},ack_latency_us_max={},links_failed={}",
                servers.get(index).map_or("?", String::as_str),
                stats.ack_latency_us_mean(),
                stats.ack_latency_us_max,
                stats.links_failed
            ));
        }
        lines
    }
}

/// Redis's line for its one database from the servers' count (none when it has no key, as in
/// Redis). No key expires yet. Without a count (it failed, or INFO ran inside MULTI) one line
/// says so, rather than an empty section that would read as "no keys".
fn keyspace_info(keys: Option<u64>) -> Vec<String> {
    match keys {
        Some(0) => Vec::new(),
        Some(keys) => vec![format!("db0:keys={keys},expires=0,avg_ttl=0")],
        None => vec!["rampkv_keyspace:not counted (the count failed, or INFO ran inside MULTI)".to_string()],
    }
}

/// A `NAME   1234 kB` line of a /proc file, in bytes (None where /proc is not).
fn proc_bytes(path: &str, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|line| line.starts_with(name))?;
    let mut fields = line[name.len()..].split_whitespace();
    let amount: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => amount.checked_mul(1024),
        None => Some(amount),
        Some(_) => None,
    }
}

/// Redis's `bytesToHuman`: `512B`, `1.50K`, `12.07M`, `2.00G`, ...
fn bytes_human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["K", "M", "G", "T", "P"];
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let (mut amount, mut unit) = (bytes as f64 / 1024.0, 0);
    while amount >= 1024.0 && unit + 1 < UNITS.len() {
        amount /= 1024.0;
        unit += 1;
    }
    format!("{amount:.2}{}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_redis_shows_them() {
        assert_eq!(bytes_human(0), "0B");
        assert_eq!(bytes_human(1023), "1023B");
        assert_eq!(bytes_human(1536), "1.50K");
        assert_eq!(bytes_human(12_660_736), "12.07M");
        assert_eq!(bytes_human(25_276_502_016), "23.54G");
    }

    #[test]
    fn proc_lines_are_read_in_bytes() {
        if cfg!(target_os = "linux") {
            assert!(proc_bytes("/proc/self/status", "VmRSS:").is_some_and(|rss| rss > 0));
            assert!(proc_bytes("/proc/meminfo", "MemTotal:").is_some_and(|total| total > 1024 * 1024));
        }
        assert_eq!(proc_bytes("/nonexistent", "VmRSS:"), None);
    }
}
