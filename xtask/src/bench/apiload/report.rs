//! One row of `bench apiload` (a timing at a load level): its figures, the header and its line.

/// Figures of one row (one timing at one load level).
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// Timing label (`default`, `fast`, ...).
    pub timings: String,
    /// Concurrent load loops.
    pub load: usize,
    /// Window length, seconds.
    pub window_s: f64,
    /// Completed LISTs per second (all loops).
    pub lists_per_s: f64,
    /// Completed PATCHes per second.
    pub writes_per_s: f64,
    /// Load requests that failed (error or non-2xx).
    pub load_failures: u64,
    /// CPU of kube-apiserver, percent of one core.
    pub apiserver_cpu: Option<f64>,
    /// CPU of etcd, percent of one core.
    pub etcd_cpu: Option<f64>,
    /// CPU of this process (the load loops, the watchers), percent of one core.
    pub xtask_cpu: Option<f64>,
    /// Successful renewals in the window (all nodes).
    pub renewals: f64,
    /// Their mean latency, ms.
    pub renew_mean_ms: Option<f64>,
    /// Their 95th percentile, ms, estimated from the histogram's buckets.
    pub renew_p95_ms: Option<f64>,
    /// Failed renew attempts (`vipd_lease_renew_failures_total`).
    pub renew_failures: f64,
    /// Lease writes (watch events) per second.
    pub lease_writes_per_s: f64,
    /// Longest time between two Lease writes (renewTime), ms.
    pub max_write_gap_ms: Option<f64>,
    /// `stepping down` lines in the vipd logs.
    pub step_downs: usize,
    /// `acquired lease; leading` lines in the vipd logs.
    pub acquisitions: usize,
    /// Times the Lease's holder became a different node.
    pub holder_changes: usize,
    /// Time with two or more ARP responders for the VIP, ms.
    pub two_responders_ms: f64,
    /// The probe's longest gap, ms.
    pub probe_gap_ms: Option<f64>,
    /// Probe failures.
    pub probe_failures: u64,
    /// Probe requests with a known outcome.
    pub probe_requests: u64,
    /// Step-down reasons seen, with counts.
    pub reasons: Vec<(String, usize)>,
    /// Anything worth a look.
    pub notes: Vec<String>,
}

/// The header of the table of rows.
pub(super) fn header() -> String {
    format!(
        "{:<8} {:>4} {:>6} {:>7} {:>5} {:>5} {:>5} {:>5} | {:>6} {:>6} {:>6} {:>5} | {:>5} {:>6} | {:>5} {:>4} {:>6} {:>7} | {:>5} {:>6} {:>9}",
        "timings",
        "load",
        "LIST/s",
        "PATCH/s",
        "lfail",
        "api%",
        "etcd%",
        "gen%",
        "renews",
        "mean",
        "p95~",
        "rfail",
        "lw/s",
        "maxgap",
        "stepd",
        "acq",
        "moves",
        "moves/m",
        "2resp",
        "gap",
        "pfail"
    )
}

/// One row of the table, under [`header`].
pub(super) fn row_line(r: &Row) -> String {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    format!(
        "{:<8} {:>4} {:>6.1} {:>7.1} {:>5} {:>5} {:>5} {:>5} | {:>6.0} {:>6} {:>6} {:>5.0} | {:>5.1} {:>6} | {:>5} {:>4} {:>6} {:>7.1} | {:>5.0} {:>6} {:>9}",
        r.timings,
        r.load,
        r.lists_per_s,
        r.writes_per_s,
        r.load_failures,
        opt(r.apiserver_cpu),
        opt(r.etcd_cpu),
        opt(r.xtask_cpu),
        r.renewals,
        opt(r.renew_mean_ms),
        opt(r.renew_p95_ms),
        r.renew_failures,
        r.lease_writes_per_s,
        opt(r.max_write_gap_ms),
        r.step_downs,
        r.acquisitions,
        r.holder_changes,
        r.holder_changes as f64 * 60.0 / r.window_s.max(1.0),
        r.two_responders_ms,
        opt(r.probe_gap_ms),
        format!("{}/{}", r.probe_failures, r.probe_requests),
    )
}
