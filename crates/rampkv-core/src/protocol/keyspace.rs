//! The client's key space machines, I/O-free like the transactions: one page of a partition's
//! live keys ([`ListTxn`], LIST_KEYS to the partition's server), and the count of every live
//! key of the cluster ([`CountTxn`], COUNT_KEYS to every server for its partitions, summed).
//!
//! # Contract
//! A listing is a sequence of pages, partition by partition; each page resumes after the hash
//! the previous one returned, so the servers' guarantee (`storage::listing`) holds for the
//! whole key space: every key live for the whole listing is returned at least once. A reply
//! is checked before it is believed: the keys must be of the partition, in increasing hash
//! order, above the cursor and not above the resume point, and the resume point must move
//! forward, so a broken or hostile server can neither send keys of another partition nor keep
//! a listing going forever. A count is exact when no write runs during it.

use super::{make_tag, split_tag, MalformedReply, Outgoing, ProtocolError, Step};
use crate::cluster::{key_hash, Cluster};
use crate::limits::{COUNT_PARTITIONS_PER_REQUEST_MAX, LIST_PAGE_KEYS_MAX};
use crate::wire::{CountKeys, KeyPage, ListKeys, Request, Response};

/// One page of a partition's live keys.
#[derive(Debug)]
pub struct ListTxn {
    server: usize,
    request: ListKeys,
    done: bool,
}

impl ListTxn {
    /// A page of at most `keys_max` keys (clamped to 1..=`LIST_PAGE_KEYS_MAX`) of `partition`,
    /// after hash `after` (`None`: from its start).
    pub fn new(cluster: &Cluster, partition: u32, after: Option<u64>, keys_max: usize) -> Result<Self, ProtocolError> {
        let Some(server) = cluster.owner_of_partition(partition) else {
            let why = "a partition beyond the cluster's";
            return Err(ProtocolError::InvalidTransaction(super::InvalidTransaction::Partition { partition, why }));
        };
        let keys_max = keys_max.clamp(1, LIST_PAGE_KEYS_MAX) as u32;
        let request = ListKeys { partitions: cluster.partition_count(), partition, after, keys_max };
        Ok(ListTxn { server, request, done: false })
    }

    /// The partition listed.
    pub fn partition(&self) -> u32 {
        self.request.partition
    }

    pub fn start(&mut self, out: &mut Vec<Outgoing>) {
        out.push(Outgoing {
            server: self.server,
            tag: make_tag(0, 0),
            request: Request::ListKeys(self.request.clone()),
        });
    }

    pub fn on_reply(&mut self, tag: u32, response: Response) -> Result<Step<KeyPage>, ProtocolError> {
        let server = self.server;
        if tag != make_tag(0, 0) || self.done {
            let why = if self.done { MalformedReply::Duplicate } else { MalformedReply::UnknownTag { tag } };
            return Err(ProtocolError::MalformedReply { server, why });
        }
        self.done = true;
        let page = match response {
            Response::Keys(page) => page,
            Response::Error { code, message } => return Err(ProtocolError::ServerError { server, code, message }),
            other => {
                let why = MalformedReply::UnexpectedKind { kind: other.kind(), expected: "KEYS" };
                return Err(ProtocolError::MalformedReply { server, why });
            }
        };
        if let Err(why) = self.check(&page) {
            return Err(ProtocolError::MalformedReply { server, why: MalformedReply::Listing { why } });
        }
        Ok(Step::Done(page))
    }

    /// Why `page` cannot be the answer to this request (module contract).
    fn check(&self, page: &KeyPage) -> Result<(), &'static str> {
        let partitions = u64::from(self.request.partitions);
        let mut previous = self.request.after;
        for key in &page.keys {
            let hash = key_hash(key);
            if hash % partitions != u64::from(self.request.partition) {
                return Err("a key of another partition");
            }
            // Equal hashes are a collision (the keys of one hash come together).
            if previous.is_some_and(|previous| hash < previous) || self.request.after.is_some_and(|after| hash <= after)
            {
                return Err("keys out of hash order, or not above the cursor");
            }
            if page.resume.is_some_and(|resume| hash > resume) {
                return Err("a key beyond the resume point");
            }
            previous = Some(hash);
        }
        if let (Some(resume), Some(after)) = (page.resume, self.request.after) {
            if resume <= after {
                return Err("a resume point that does not move forward");
            }
        }
        Ok(())
    }
}

/// The count of every live key of the cluster.
#[derive(Debug)]
pub struct CountTxn {
    /// Per request: its server and the partitions it counts.
    parts: Vec<(usize, Vec<u32>)>,
    answered: Vec<bool>,
    outstanding: usize,
    total: u64,
    partitions: u32,
}

impl CountTxn {
    pub fn new(cluster: &Cluster) -> Self {
        let mut parts = Vec::new();
        for server in 0..cluster.servers().len() {
            let owned: Vec<u32> = cluster.partitions_of(server).collect();
            parts.extend(owned.chunks(COUNT_PARTITIONS_PER_REQUEST_MAX).map(|chunk| (server, chunk.to_vec())));
        }
        let answered = vec![false; parts.len()];
        CountTxn { outstanding: parts.len(), parts, answered, total: 0, partitions: cluster.partition_count() }
    }

    /// Every partition it counts (a server's unavailability fails it).
    pub fn partitions(&self) -> impl Iterator<Item = u32> + '_ {
        self.parts.iter().flat_map(|(_, partitions)| partitions.iter().copied())
    }

    pub fn start(&mut self, out: &mut Vec<Outgoing>) {
        for (index, (server, of)) in self.parts.iter().enumerate() {
            let request = Request::CountKeys(CountKeys { partitions: self.partitions, of: of.clone() });
            out.push(Outgoing { server: *server, tag: make_tag(0, index as u16), request });
        }
    }

    /// Whether it has nothing to ask (a cluster without partitions: never, but checked).
    pub fn is_done(&self) -> bool {
        self.outstanding == 0
    }

    pub fn on_reply(&mut self, tag: u32, response: Response) -> Result<Step<u64>, ProtocolError> {
        let (attempt, part) = split_tag(tag);
        let part = usize::from(part);
        let server = self.parts.get(part).map_or(usize::MAX, |(server, _)| *server);
        if attempt != 0 || part >= self.parts.len() || self.answered[part] {
            return Err(ProtocolError::MalformedReply { server, why: MalformedReply::UnknownTag { tag } });
        }
        let count = match response {
            Response::KeyCount { count } => count,
            Response::Error { code, message } => return Err(ProtocolError::ServerError { server, code, message }),
            other => {
                let why = MalformedReply::UnexpectedKind { kind: other.kind(), expected: "KEY_COUNT" };
                return Err(ProtocolError::MalformedReply { server, why });
            }
        };
        self.answered[part] = true;
        self.outstanding -= 1;
        self.total = self.total.saturating_add(count);
        Ok(if self.outstanding == 0 { Step::Done(self.total) } else { Step::Pending })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(servers: usize, partitions: u32) -> Cluster {
        let addresses = (0..servers).map(|index| format!("127.0.0.1:{}", 9000 + index)).collect::<Vec<_>>();
        let text = format!(
            "partitions = {partitions}\n{}",
            addresses.iter().map(|address| format!("[[servers]]\naddress = \"{address}\"\n")).collect::<String>()
        );
        Cluster::from_toml(&text).unwrap_or_else(|_| Cluster::with_servers(addresses).unwrap())
    }

    fn key_of(partition: u32, partitions: u32, skip: usize) -> Vec<u8> {
        (0..)
            .map(|index: u32| format!("k{index}").into_bytes())
            .filter(|key| key_hash(key) % u64::from(partitions) == u64::from(partition))
            .nth(skip)
            .unwrap()
    }

    #[test]
    fn a_page_from_a_broken_server_is_refused_not_believed() {
        let cluster = cluster(2, 4);
        let partitions = cluster.partition_count();
        let mut keys: Vec<Vec<u8>> = (0..3).map(|skip| key_of(1, partitions, skip)).collect();
        keys.sort_by_key(|key| key_hash(key));
        let after = key_hash(&keys[0]);
        let reply = |keys: Vec<Vec<u8>>, resume| {
            let mut txn = ListTxn::new(&cluster, 1, Some(after), 10).unwrap();
            let mut out = Vec::new();
            txn.start(&mut out);
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].server, cluster.owner_of_partition(1).unwrap());
            txn.on_reply(out[0].tag, Response::Keys(KeyPage { keys, resume }))
        };
        let good = reply(keys[1..].to_vec(), None);
        assert!(matches!(good, Ok(Step::Done(ref page)) if page.keys.len() == 2), "{good:?}");
        let other_partition = key_of(2, partitions, 0);
        assert!(reply(vec![other_partition], None).is_err(), "a key of partition 2");
        assert!(reply(vec![keys[0].clone()], None).is_err(), "not above the cursor");
        assert!(reply(vec![keys[2].clone(), keys[1].clone()], None).is_err(), "out of order");
        assert!(reply(Vec::new(), Some(after)).is_err(), "a resume point that stays put");
        assert!(reply(vec![keys[2].clone()], Some(key_hash(&keys[1]))).is_err(), "a key past the resume point");
        assert!(ListTxn::new(&cluster, partitions, None, 10).is_err(), "no such partition");
    }

    #[test]
    fn a_count_asks_every_server_for_its_partitions_and_sums() {
        let cluster = cluster(3, 8);
        let mut txn = CountTxn::new(&cluster);
        let mut out = Vec::new();
        txn.start(&mut out);
        assert_eq!(out.len(), 3);
        let mut counted: Vec<u32> = txn.partitions().collect();
        counted.sort_unstable();
        assert_eq!(counted, (0..cluster.partition_count()).collect::<Vec<_>>());
        assert!(matches!(txn.on_reply(out[0].tag, Response::KeyCount { count: 5 }), Ok(Step::Pending)));
        assert!(txn.on_reply(out[0].tag, Response::KeyCount { count: 5 }).is_err(), "a second reply");
        assert!(matches!(txn.on_reply(out[1].tag, Response::KeyCount { count: 0 }), Ok(Step::Pending)));
        assert!(matches!(txn.on_reply(out[2].tag, Response::KeyCount { count: 7 }), Ok(Step::Done(12))));
    }
}
