//! The systems compared, in table order.

use serde::Serialize;

/// One system the comparison runs every query against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum System {
    /// Redis, `BITOP` over dense strings.
    Redis,
    /// bitfold end to end through the master.
    Bitfold,
    /// roaring-rs in this process.
    Roaring,
    /// The memory-bandwidth roof: each query's vectors read once.
    Roof,
}

impl System {
    /// Every system, in table order.
    pub const ALL: [System; 4] = [
        System::Redis,
        System::Bitfold,
        System::Roaring,
        System::Roof,
    ];

    /// Whether it computes the count (the roof only reads), so that its
    /// answers must agree with the others'.
    pub fn counts(self) -> bool {
        self != System::Roof
    }

    /// Whether its CPU time is measured (the roof is only a bound).
    pub fn measures_cpu(self) -> bool {
        self != System::Roof
    }

    /// Whether clients ask it over connections, so that the clients' CPU
    /// is measured apart from its own (roaring-rs and the roof run in the
    /// asking thread: there the client is the system).
    pub fn serves_clients(self) -> bool {
        matches!(self, System::Redis | System::Bitfold)
    }

    /// Its name in the chart's legend.
    pub fn legend(self) -> &'static str {
        match self {
            System::Redis => "Redis (BITOP by 16)",
            System::Bitfold => "bitfold (count)",
            System::Roaring => "roaring-rs",
            System::Roof => "memory roof",
        }
    }
}
