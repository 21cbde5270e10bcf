//! Local wall-clock times of day for `vipd probe`'s lines and summary.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `HH:MM:SS.mmm` of `start + offset` in the local time zone (libc `localtime_r`, which
/// honours `TZ` like `date`); UTC if the conversion fails.
pub(super) fn wall_clock(start: SystemTime, offset: Duration) -> String {
    let since_epoch = start
        .checked_add(offset)
        .unwrap_or(start)
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since_epoch.as_secs();
    let millis = since_epoch.subsec_millis();
    let (h, m, s) = local_hms(secs).unwrap_or(((secs / 3600) % 24, (secs / 60) % 60, secs % 60));
    format!("{h:02}:{m:02}:{s:02}.{millis:03}")
}

/// Local hour, minute, second of a Unix time, or `None` if libc cannot convert it.
fn local_hms(unix_secs: u64) -> Option<(u64, u64, u64)> {
    let t = libc::time_t::try_from(unix_secs).ok()?;
    // SAFETY: `tm` is plain old data for which all-zero bytes are a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the duration of the call; localtime_r is the
    // re-entrant variant that writes only into `tm`.
    let res = unsafe { libc::localtime_r(&t, &mut tm) };
    if res.is_null() {
        return None;
    }
    let field = |v: libc::c_int| u64::try_from(v).ok();
    Some((field(tm.tm_hour)?, field(tm.tm_min)?, field(tm.tm_sec)?))
}
