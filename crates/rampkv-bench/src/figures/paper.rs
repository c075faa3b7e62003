//! The headline ratios of the reference paper (Murata et al., "Accelerating RAMP transactions
//! with RDMA", section V), each with the two of our series it corresponds to.
//!
//! What the paper compares (from its text):
//! - Fig. 5: throughput of RAMP-Fast over IPoIB, Send/Recv verbs and RDMA-Write (GET+/PUT+),
//!   each divided by RAMP-Fast over TCP on Gigabit Ethernet: 1.32x, 2.39x, 2.53x. Both TCP
//!   baselines are loopback TCP here, so IPoIB has no counterpart of its own.
//! - Fig. 6: Proposed(GET+, PUT+) and Proposed(GET*, PUT+) over RAMP(GET, PUT) on IPoIB at
//!   transaction size 4: 2.07x and 2.78x.
//! - Fig. 7: the same pairs at 100% reads on the micro-benchmark: 1.94x and 2.69x.
//! - Fig. 8: the same pairs at 100% reads on YCSB: 2.06x and 2.67x.

use super::Sweep;

/// One ratio the paper reports, and the series (comm: transports) it maps to here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaperRatio {
    pub sweep: Sweep,
    /// Where the paper reads the ratio off (ignored for comm).
    pub at_x: f64,
    /// The paper's words for the pair.
    pub paper_pair: &'static str,
    /// Our series id (comm: transport name) of the numerator, or `None` when nothing here
    /// corresponds to it.
    pub numerator: Option<&'static str>,
    /// Our series id (comm: transport name) of the denominator.
    pub denominator: &'static str,
    pub paper: f64,
}

/// Every ratio the paper states for its four figures.
pub const PAPER_RATIOS: [PaperRatio; 9] = [
    PaperRatio {
        sweep: Sweep::Comm,
        at_x: 0.0,
        paper_pair: "IPoIB / Eth (both TCP)",
        numerator: None,
        denominator: "tcp",
        paper: 1.32,
    },
    PaperRatio {
        sweep: Sweep::Comm,
        at_x: 0.0,
        paper_pair: "Send/Recv verbs / Eth",
        numerator: Some("sendrecv"),
        denominator: "tcp",
        paper: 2.39,
    },
    PaperRatio {
        sweep: Sweep::Comm,
        at_x: 0.0,
        paper_pair: "RDMA-Write (GET+/PUT+) / Eth",
        numerator: Some("writepoll"),
        denominator: "tcp",
        paper: 2.53,
    },
    PaperRatio {
        sweep: Sweep::TxnSize,
        at_x: 4.0,
        paper_pair: "Proposed(GET+, PUT+) / RAMP(GET, PUT)",
        numerator: Some("ramp-fast-writepoll"),
        denominator: "ramp-fast-tcp",
        paper: 2.07,
    },
    PaperRatio {
        sweep: Sweep::TxnSize,
        at_x: 4.0,
        paper_pair: "Proposed(GET*, PUT+) / RAMP(GET, PUT)",
        numerator: Some("ramp-fast-onesided"),
        denominator: "ramp-fast-tcp",
        paper: 2.78,
    },
    PaperRatio {
        sweep: Sweep::ReadRatio,
        at_x: 100.0,
        paper_pair: "Proposed(GET+, PUT+) / RAMP(GET, PUT)",
        numerator: Some("ramp-fast-writepoll"),
        denominator: "ramp-fast-tcp",
        paper: 1.94,
    },
    PaperRatio {
        sweep: Sweep::ReadRatio,
        at_x: 100.0,
        paper_pair: "Proposed(GET*, PUT+) / RAMP(GET, PUT)",
        numerator: Some("ramp-fast-onesided"),
        denominator: "ramp-fast-tcp",
        paper: 2.69,
    },
    PaperRatio {
        sweep: Sweep::Ycsb,
        at_x: 100.0,
        paper_pair: "Proposed(GET+, PUT+) / RAMP(GET, PUT)",
        numerator: Some("ramp-fast-writepoll"),
        denominator: "ramp-fast-tcp",
        paper: 2.06,
    },
    PaperRatio {
        sweep: Sweep::Ycsb,
        at_x: 100.0,
        paper_pair: "Proposed(GET*, PUT+) / RAMP(GET, PUT)",
        numerator: Some("ramp-fast-onesided"),
        denominator: "ramp-fast-tcp",
        paper: 2.67,
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::METHODS;

    #[test]
    fn every_ratio_names_a_method_or_transport_the_figures_know() {
        for ratio in PAPER_RATIOS {
            let known = |id: &str| match ratio.sweep {
                // Transports may come from other branches: only the baseline must exist.
                Sweep::Comm => id == "tcp" || ["sendrecv", "writepoll"].contains(&id),
                _ => METHODS.iter().any(|method| method.id == id),
            };
            assert!(known(ratio.denominator), "{ratio:?}");
            assert!(ratio.numerator.is_none_or(known), "{ratio:?}");
        }
    }
}
