//! The fence's transactions: what they send (in `nft` syntax; the bytes are checked against
//! what `nft` sends in `nl::tests`), and, through a model of the kernel's maps, sets and
//! chains, that every transaction is one the kernel takes and that each VIP is answered
//! exactly as its holders asked.

use super::*;
use crate::net::nft::nl::Recorder;
use std::collections::{BTreeMap, BTreeSet};

fn v4() -> IpAddr {
    "192.0.2.10".parse().expect("ip")
}
fn v6() -> IpAddr {
    "2001:db8::10".parse().expect("ip")
}

/// A fence on a [`Recorder`], after its setup.
async fn recorded() -> (NftFence, Recorder) {
    let rec = Recorder::default();
    let f = NftFence::start_with(Arc::new(rec.clone())).await.unwrap();
    (f, rec)
}

fn refresh(owner: Owner, vips: &[IpAddr], until: Instant) -> Op {
    Op {
        vips: distinct(vips),
        change: Change::Refresh(until),
        owner,
    }
}

fn op(owner: Owner, vips: &[IpAddr], change: Change) -> Op {
    Op {
        vips: distinct(vips),
        change,
        owner,
    }
}

/// Plans `ops` at `now` from `rec` and records the plan as run at once; the commands.
fn run(rec: &mut Recorded, ops: &[Op], now: Instant, updates: bool) -> Vec<String> {
    let p = plan(ops, rec, now, updates);
    let lines = p.batch.lines();
    rec.record(p, now, now);
    lines
}

#[test]
fn setup_replaces_only_vipds_fence_tables() {
    let c = setup_commands().lines();
    for l in c.iter().filter(|l| l.starts_with("delete")) {
        assert!(l.ends_with(&format!(" {FENCE_TABLE}")), "{l}");
    }
    // Every delete is preceded by an add of the same table, so it cannot fail.
    assert_eq!(&c[..4], &remove_commands().lines()[..]);
    assert!(c.contains(&"add map arp vipd_fence vips { type ipv4_addr : verdict; }".to_string()));
    assert!(c.contains(&"add set inet vipd_fence live { type mark; flags timeout; }".to_string()));
    assert!(c.contains(
        &"add rule inet vipd_fence prerouting icmpv6 type nd-neighbor-solicit @th,64,128 vmap @vips6"
            .to_string()
    ));
}

/// A holder's first refresh creates its chains before the map elements that jump to them;
/// its later renewals set one live element a table, whatever the number of its VIPs.
#[test]
fn a_holders_renewal_is_one_element_a_table() {
    let now = Instant::now();
    let base = u128::from("2001:db8::1:0".parse::<std::net::Ipv6Addr>().unwrap());
    let vips: Vec<IpAddr> = (0..600u128)
        .map(|i| IpAddr::from(std::net::Ipv6Addr::from(base + i)))
        .chain([v4()])
        .collect();
    let mut rec = Recorded::default();
    let first = run(
        &mut rec,
        &[refresh(7, &vips, now + Duration::from_millis(1800))],
        now,
        true,
    );
    assert_eq!(
        &first[..4],
        [
            "add chain arp vipd_fence holder_1",
            "add rule arp vipd_fence holder_1 1 != @live counter drop comment \"holder 1: its VIPs are dropped once its element 1 of @live expires\"",
            "add chain inet vipd_fence holder_1",
            "add rule inet vipd_fence holder_1 1 != @live counter drop comment \"holder 1: its VIPs are dropped once its element 1 of @live expires\"",
        ]
    );
    assert!(
        first.contains(
            &"add element arp vipd_fence vips { 192.0.2.10 : jump holder_1 }".to_string()
        )
    );
    assert!(
        first.contains(
            &"add element inet vipd_fence vips4 { 192.0.2.10 : jump holder_1 }".to_string()
        )
    );
    assert!(first.contains(
        &"add element inet vipd_fence vips6 { 2001:db8::1:0 : jump holder_1 }".to_string()
    ));
    assert_eq!(first.len(), 4 + 602 + 2, "{first:#?}");
    let later = now + Duration::from_millis(1000);
    for updates in [true, false] {
        let c = plan(
            &[refresh(7, &vips, later + Duration::from_millis(1800))],
            &rec,
            later,
            updates,
        );
        let lines = c.batch.lines();
        if updates {
            assert_eq!(
                lines,
                [
                    "add element arp vipd_fence live { 1 timeout 1800ms expires 1800ms }",
                    "add element inet vipd_fence live { 1 timeout 1800ms expires 1800ms }",
                ]
            );
        } else {
            // Still live: replaced (a plain add keeps its old timeout).
            assert_eq!(
                lines,
                [
                    "add element arp vipd_fence live { 1 timeout 1800ms }",
                    "delete element arp vipd_fence live { 1 }",
                    "add element arp vipd_fence live { 1 timeout 1800ms }",
                    "add element inet vipd_fence live { 1 timeout 1800ms }",
                    "delete element inet vipd_fence live { 1 }",
                    "add element inet vipd_fence live { 1 timeout 1800ms }",
                ]
            );
        }
        assert_eq!(c.batch.messages().len(), if updates { 2 } else { 6 });
    }
    // Known expired: only added.
    let late = now + Duration::from_secs(5);
    let c = plan(
        &[refresh(7, &vips, late + Duration::from_millis(600))],
        &rec,
        late,
        false,
    );
    assert_eq!(
        c.batch.lines(),
        [
            "add element arp vipd_fence live { 1 timeout 600ms }",
            "add element inet vipd_fence live { 1 timeout 600ms }",
        ]
    );
}

/// The timeout is what is left of the end when the transaction is written; with less than
/// 1 ms left the VIPs are mapped to `drop` and no element is set.
#[test]
fn the_timeout_is_the_time_left_when_the_run_is_written() {
    let asked = Instant::now();
    let until = asked + Duration::from_millis(1950);
    let c = plan(
        &[refresh(1, &[v4()], until)],
        &Recorded::default(),
        asked + Duration::from_millis(300),
        false,
    );
    assert!(
        c.batch
            .lines()
            .contains(&"add element inet vipd_fence live { 1 timeout 1650ms }".to_string()),
        "{:?}",
        c.batch.lines()
    );
    let c = plan(
        &[refresh(1, &[v4()], until)],
        &Recorded::default(),
        asked + Duration::from_millis(1950),
        false,
    );
    let lines = c.batch.lines();
    assert!(
        lines.contains(&"add element arp vipd_fence vips { 192.0.2.10 : drop }".to_string()),
        "{lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains(" live ")),
        "no live element: {lines:?}"
    );
    assert_eq!(
        timeout_until(until, asked + Duration::from_micros(1_949_500)),
        Duration::ZERO,
        "under a millisecond left: nothing"
    );
    let written = asked + Duration::from_millis(300);
    assert_eq!(
        ends_by(until, written, written + Duration::from_millis(20)),
        until + Duration::from_millis(20),
        "a run that took 20 ms may keep the element 20 ms past the end"
    );
}

/// An expire maps the VIPs to `drop` (still filtered: a VIP the maps did not hold is added);
/// the holder's next refresh maps them back; a disarm takes them out of the maps.
#[test]
fn expire_drops_the_vips_until_the_next_refresh_and_disarm_unfilters_them() {
    let now = Instant::now();
    let mut rec = Recorded::default();
    run(
        &mut rec,
        &[refresh(1, &[v4(), v6()], now + Duration::from_secs(2))],
        now,
        true,
    );
    let c = run(&mut rec, &[op(0, &[v4(), v6()], Change::Expire)], now, true);
    assert_eq!(
        c,
        [
            "add element arp vipd_fence vips { 192.0.2.10 : jump holder_1 }",
            "delete element arp vipd_fence vips { 192.0.2.10 }",
            "add element arp vipd_fence vips { 192.0.2.10 : drop }",
            "add element inet vipd_fence vips4 { 192.0.2.10 : jump holder_1 }",
            "delete element inet vipd_fence vips4 { 192.0.2.10 }",
            "add element inet vipd_fence vips4 { 192.0.2.10 : drop }",
            "add element inet vipd_fence vips6 { 2001:db8::10 : jump holder_1 }",
            "delete element inet vipd_fence vips6 { 2001:db8::10 }",
            "add element inet vipd_fence vips6 { 2001:db8::10 : drop }",
        ]
    );
    let c = run(
        &mut rec,
        &[refresh(1, &[v4(), v6()], now + Duration::from_secs(2))],
        now,
        true,
    );
    assert!(
        c.contains(
            &"add element inet vipd_fence vips6 { 2001:db8::10 : jump holder_1 }".to_string()
        ),
        "{c:?}"
    );
    // An expire of a VIP no map holds adds it, dropped.
    let other: IpAddr = "192.0.2.99".parse().unwrap();
    let c = run(&mut rec, &[op(0, &[other], Change::Expire)], now, true);
    assert_eq!(
        c,
        [
            "add element arp vipd_fence vips { 192.0.2.99 : drop }",
            "add element inet vipd_fence vips4 { 192.0.2.99 : drop }",
        ]
    );
    // The last VIPs of holder 1 disarmed: out of the maps, then its chains go.
    let c = run(&mut rec, &[op(1, &[v4(), v6()], Change::Disarm)], now, true);
    assert_eq!(
        c.last().map(String::as_str),
        Some("delete chain inet vipd_fence holder_1"),
        "{c:#?}"
    );
    assert!(c.contains(&"delete element inet vipd_fence vips6 { 2001:db8::10 }".to_string()));
    assert!(rec.owners.is_empty() && !rec.vips.contains_key(&v4()));
    // A disarm of what is not armed sends nothing.
    assert!(run(&mut rec, &[op(1, &[v4()], Change::Disarm)], now, true).is_empty());
}

/// An address that moved from one holder of this node to another: the first's disarm
/// leaves it filtered, jumping to the second holder's chain (answered while that holder's
/// element lives, without a gap).
#[test]
fn a_vip_moved_to_another_holder_follows_that_holders_element() {
    let now = Instant::now();
    let mut rec = Recorded::default();
    run(
        &mut rec,
        &[refresh(1, &[v4()], now + Duration::from_secs(2))],
        now,
        true,
    );
    run(
        &mut rec,
        &[refresh(2, &[v4()], now + Duration::from_secs(3))],
        now,
        true,
    );
    // Holder 1 refreshes once more (its last renewal), then lets go.
    run(
        &mut rec,
        &[refresh(1, &[v4()], now + Duration::from_secs(2))],
        now,
        true,
    );
    let c = run(&mut rec, &[op(1, &[v4()], Change::Disarm)], now, true);
    assert!(
        c.contains(&"add element arp vipd_fence vips { 192.0.2.10 : jump holder_2 }".to_string()),
        "{c:#?}"
    );
    assert!(
        c.contains(&"delete chain arp vipd_fence holder_1".to_string()),
        "{c:#?}"
    );
    assert_eq!(rec.vips[&v4()].owners, vec![2]);
}

/// A holder refreshes all its VIPs: one it still arms but no longer names (its disarm
/// failed) stops living on its element: dropped, or jumping to another holder of the node
/// that armed it, until the disarm goes through (found by the new-user trial: it stayed
/// answered on the holder's renewals).
#[test]
fn a_vip_its_holder_no_longer_names_stops_living_on_its_element() {
    let now = Instant::now();
    let b: IpAddr = "192.0.2.11".parse().unwrap();
    let c: IpAddr = "192.0.2.12".parse().unwrap();
    let mut rec = Recorded::default();
    let end = now + Duration::from_secs(2);
    run(&mut rec, &[refresh(1, &[v4(), b, c], end)], now, true);
    run(&mut rec, &[refresh(2, &[c], end)], now, true);
    run(&mut rec, &[refresh(1, &[v4(), b, c], end)], now, true);
    // b's and c's disarms failed (nothing recorded); holder 1 renews what it holds.
    let later = now + Duration::from_secs(1);
    let lines = run(
        &mut rec,
        &[refresh(1, &[v4()], later + Duration::from_secs(2))],
        later,
        true,
    );
    assert!(
        lines.contains(&"add element arp vipd_fence vips { 192.0.2.11 : drop }".to_string()),
        "{lines:#?}"
    );
    assert!(
        lines.contains(
            &"add element arp vipd_fence vips { 192.0.2.12 : jump holder_2 }".to_string()
        ),
        "{lines:#?}"
    );
    assert_eq!(
        rec.vips[&b].owners,
        vec![1],
        "still armed by holder 1: its disarm will find it"
    );
    // A steady renewal again touches no map.
    let lines = run(
        &mut rec,
        &[refresh(1, &[v4()], later + Duration::from_secs(2))],
        later,
        true,
    );
    assert!(!lines.iter().any(|l| l.contains(" vips ")), "{lines:#?}");
    let lines = run(&mut rec, &[op(1, &[b, c], Change::Disarm)], later, true);
    assert!(
        lines.contains(&"delete element arp vipd_fence vips { 192.0.2.11 }".to_string()),
        "{lines:#?}"
    );
    assert_eq!(rec.vips[&c].owners, vec![2]);
}

/// Tracked VIPs (egress) get their own element in `live4`/`live6`, set with their holder's,
/// and lose it when they leave the set or their holder's arming ends.
#[test]
fn tracked_vips_live_one_by_one_as_their_holder() {
    let now = Instant::now();
    let mut rec = Recorded::default();
    run(
        &mut rec,
        &[refresh(1, &[v4(), v6()], now + Duration::from_secs(2))],
        now,
        true,
    );
    let later = now + Duration::from_millis(500);
    let c = run(&mut rec, &[op(0, &[v4()], Change::Track)], later, true);
    assert_eq!(
        c,
        ["add element inet vipd_fence live4 { 192.0.2.10 timeout 1500ms expires 1500ms }"],
        "from the holder's last refresh"
    );
    let c = run(
        &mut rec,
        &[refresh(1, &[v4(), v6()], later + Duration::from_secs(2))],
        later,
        false,
    );
    assert!(
        c.contains(&"add element inet vipd_fence live4 { 192.0.2.10 timeout 2000ms }".to_string()),
        "{c:#?}"
    );
    assert!(
        !c.iter().any(|l| l.contains("live6")),
        "not tracked: {c:#?}"
    );
    let c = run(&mut rec, &[op(0, &[v4()], Change::Expire)], later, true);
    assert!(
        c.ends_with(&[
            "add element inet vipd_fence live4 { 192.0.2.10 timeout 1ms }".to_string(),
            "delete element inet vipd_fence live4 { 192.0.2.10 }".to_string(),
        ]),
        "{c:#?}"
    );
    let c = run(&mut rec, &[op(0, &[], Change::Track)], later, true);
    assert_eq!(
        c,
        [
            "add element inet vipd_fence live4 { 192.0.2.10 timeout 1ms }",
            "delete element inet vipd_fence live4 { 192.0.2.10 }",
        ]
    );
}

/// Changes queued while a run is pending go into one transaction, each caller gets the
/// run's outcome, and a failed run fails every change in it.
#[tokio::test]
async fn batched_fence_runs_queued_changes_as_one_transaction() {
    let (nft, rec) = recorded().await;
    let fence = BatchedFence::new(nft);
    let vips: Vec<IpAddr> = (1..=20)
        .map(|i| format!("192.0.2.{i}").parse().unwrap())
        .collect();
    let asked = Instant::now();
    // Far enough that a loaded machine still writes the run before the end.
    let until = asked + Duration::from_secs(15);
    let calls = vips
        .iter()
        .enumerate()
        .map(|(i, v)| fence.refresh(100 + i as u64, std::slice::from_ref(v), until));
    for r in futures::future::join_all(calls).await {
        let ends = r.expect("refreshed");
        assert!(
            ends + Duration::from_millis(1) >= until
                && ends <= Instant::now() + Duration::from_secs(15),
            "the run's end plus the timeout written"
        );
    }
    let runs: Vec<String> = rec.batches().iter().map(|b| b.lines().join("\n")).collect();
    assert_eq!(
        runs.len(),
        2,
        "setup, then one batch for the 20 changes: {runs:#?}"
    );
    for (i, v) in vips.iter().enumerate() {
        let key = i + 1;
        assert!(
            runs[1].contains(&format!(
                "add element arp vipd_fence vips {{ {v} : jump holder_{key} }}"
            )),
            "{v}: {}",
            runs[1]
        );
        let ms = runs[1]
            .split(&format!(
                "add element inet vipd_fence live {{ {key} timeout "
            ))
            .nth(1)
            .and_then(|r| r.split("ms").next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("holder {key} in the batch: {}", runs[1]));
        assert!((1..=15_000).contains(&ms), "{v}: {ms} ms");
    }
    rec.set_fail(true);
    let calls = vips[..3]
        .iter()
        .map(|v| fence.expire(std::slice::from_ref(v)));
    for r in futures::future::join_all(calls).await {
        match r {
            Err(FenceError::Change { detail, .. }) => {
                assert!(detail.contains("Invalid argument"), "{detail}")
            }
            other => panic!("expected the run's failure, got {other:?}"),
        }
    }
}

/// The fence remembers the elements it set: a renewal while the element may be live
/// replaces it, one after its timeout only adds; a failed run changes nothing it remembers.
#[tokio::test]
async fn nft_fence_replaces_only_elements_that_may_be_live() {
    let (fence, rec) = recorded().await;
    let last_run = || {
        rec.batches()
            .last()
            .map(|b| b.lines().join("\n"))
            .unwrap_or_default()
    };
    let short = Duration::from_millis(200);
    fence
        .refresh(1, &[v4()], Instant::now() + short)
        .await
        .unwrap();
    assert!(!last_run().contains("delete"), "{}", last_run());
    fence
        .refresh(1, &[v4()], Instant::now() + short)
        .await
        .unwrap();
    assert!(
        last_run().contains("delete element arp vipd_fence live { 1 }"),
        "replaced: {}",
        last_run()
    );
    tokio::time::sleep(short + LIVE_SLACK + Duration::from_millis(50)).await;
    fence
        .refresh(1, &[v4()], Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    assert!(!last_run().contains("delete"), "expired: {}", last_run());
    rec.set_fail(true);
    assert!(fence.disarm(1, &[v4()]).await.is_err());
    rec.set_fail(false);
    fence
        .refresh(1, &[v4()], Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        !last_run().contains("vips"),
        "the failed disarm changed nothing recorded: {}",
        last_run()
    );
}

/// A model of the kernel's side of the fence tables, driven by the commands' text: verdict
/// maps, live sets with timeouts and regular chains, with the kernel's refusals (an add over
/// an element with another verdict, a jump to a missing chain, a delete of what is absent or
/// expired, a delete of a chain something still jumps to). Transactions are all or nothing.
#[derive(Debug, Clone, Default)]
struct Model {
    chains: BTreeSet<(String, String)>,
    maps: BTreeMap<(String, String, String), String>,
    live: BTreeMap<(String, String, String), Instant>,
}

impl Model {
    fn apply(&mut self, lines: &[String], now: Instant) -> Result<(), String> {
        let mut next = self.clone();
        for l in lines {
            next.one(l, now).map_err(|e| format!("{e}: `{l}`"))?;
        }
        *self = next;
        Ok(())
    }

    fn one(&mut self, l: &str, now: Instant) -> Result<(), &'static str> {
        let w: Vec<&str> = l.split_whitespace().collect();
        let (fam, name) = (w[2].to_string(), w[4].to_string());
        match (w[0], w[1]) {
            ("add", "chain") => {
                self.chains.insert((fam, name));
            }
            ("add", "rule") => {
                if !self.chains.contains(&(fam, name)) {
                    return Err("ENOENT (chain)");
                }
            }
            ("delete", "chain") => {
                if !self.chains.remove(&(fam.clone(), name.clone())) {
                    return Err("ENOENT (chain)");
                }
                let jump = format!("jump {name}");
                if self.maps.iter().any(|((f, ..), v)| *f == fam && *v == jump) {
                    return Err("EBUSY");
                }
            }
            (op, "element") => {
                let key = w[6].to_string();
                let id = (fam.clone(), name.clone(), key);
                if name.starts_with("vips") {
                    if op == "delete" {
                        self.maps.remove(&id).ok_or("ENOENT (element)")?;
                        return Ok(());
                    }
                    let verdict = w[8..w.len() - 1].join(" ");
                    if let Some(chain) = verdict.strip_prefix("jump ")
                        && !self.chains.contains(&(fam, chain.to_string()))
                    {
                        return Err("ENOENT (jump)");
                    }
                    match self.maps.get(&id) {
                        Some(v) if *v != verdict => return Err("EEXIST"),
                        _ => {
                            self.maps.insert(id, verdict);
                        }
                    }
                    return Ok(());
                }
                let alive = self.live.get(&id).is_some_and(|e| *e > now);
                if op == "delete" {
                    if !alive {
                        return Err("ENOENT (element)");
                    }
                    self.live.remove(&id);
                    return Ok(());
                }
                let ms = |word: &str| -> Option<u64> {
                    let at = w.iter().position(|x| *x == word)?;
                    w.get(at + 1)?.trim_end_matches("ms").parse().ok()
                };
                let timeout = ms("timeout").ok_or("an element without a timeout")?;
                match (alive, ms("expires")) {
                    (true, Some(e)) => {
                        self.live.insert(id, now + Duration::from_millis(e));
                    }
                    (true, None) => {}
                    (false, _) => {
                        self.live.insert(id, now + Duration::from_millis(timeout));
                    }
                }
            }
            _ => return Err("unknown command"),
        }
        Ok(())
    }

    /// Whether `vip` is fenced and, if so, answered at `now`: `None` when no map holds it.
    fn answered(&self, vip: IpAddr, now: Instant) -> Option<bool> {
        let one = |fam: &str, map: &str| {
            let v = self.maps.get(&(fam.into(), map.into(), vip.to_string()))?;
            Some(match v.strip_prefix("jump holder_") {
                None => false,
                Some(key) => {
                    assert!(self.chains.contains(&(fam.into(), format!("holder_{key}"))));
                    self.live
                        .get(&(fam.into(), "live".into(), key.into()))
                        .is_some_and(|e| *e > now)
                }
            })
        };
        match vip {
            IpAddr::V4(_) => {
                let (arp, inet) = (one("arp", "vips"), one("inet", "vips4"));
                assert_eq!(arp, inet, "{vip}: both tables alike");
                arp
            }
            IpAddr::V6(_) => one("inet", "vips6"),
        }
    }

    fn per_vip(&self, vip: IpAddr, now: Instant) -> bool {
        let set = if vip.is_ipv4() { "live4" } else { "live6" };
        self.live
            .get(&("inet".into(), set.into(), vip.to_string()))
            .is_some_and(|e| *e > now)
    }
}

/// What the holders asked, VIP by VIP: the reference the model kernel is held to.
#[derive(Debug, Default)]
struct Asked {
    /// Per VIP: its holders, whether it is in the maps, expired, and the holder it follows.
    vips: HashMap<IpAddr, (BTreeSet<Owner>, bool, bool, Option<Owner>)>,
    /// Per holder: the end its last refresh with time left asked for.
    ends: HashMap<Owner, Instant>,
}

impl Asked {
    fn op(&mut self, op: &Op, now: Instant) {
        for v in &op.vips {
            let e = self.vips.entry(*v).or_default();
            match op.change {
                Change::Refresh(until) => {
                    e.0.insert(op.owner);
                    e.1 = true;
                    e.3 = Some(op.owner);
                    e.2 = timeout_until(until, now).is_zero();
                }
                Change::Expire => {
                    e.1 = true;
                    e.2 = true;
                }
                Change::Disarm => {
                    e.0.remove(&op.owner);
                    if e.0.is_empty() {
                        *e = Default::default();
                    } else if e.3 == Some(op.owner) {
                        let ends = &self.ends;
                        e.3 =
                            e.0.iter()
                                .copied()
                                .max_by_key(|o| (ends.get(o).copied(), *o));
                    }
                }
                Change::Track => {}
            }
        }
        if let Change::Refresh(_) = op.change {
            // A holder refreshes all its VIPs: one it arms but did not name stops following
            // it (another holder that armed it, or dropped).
            let ends = &self.ends;
            for (v, e) in self.vips.iter_mut() {
                if e.1 && e.3 == Some(op.owner) && !op.vips.contains(v) {
                    let other =
                        e.0.iter()
                            .copied()
                            .filter(|o| *o != op.owner)
                            .max_by_key(|o| (ends.get(o).copied(), *o));
                    match other {
                        Some(o) => e.3 = Some(o),
                        None => e.2 = true,
                    }
                }
            }
        }
        if let Change::Refresh(until) = op.change
            && !timeout_until(until, now).is_zero()
        {
            self.ends.insert(op.owner, until);
        }
    }

    fn answered(&self, vip: IpAddr, now: Instant) -> Option<bool> {
        let (_, in_map, expired, follows) = self.vips.get(&vip)?;
        if !in_map {
            return None;
        }
        Some(
            !expired
                && follows
                    .and_then(|o| self.ends.get(&o))
                    .is_some_and(|e| *e > now),
        )
    }
}

/// Over a long pseudo-random sequence of refreshes (some with their end passed), expires,
/// disarms (some by holders that never armed the VIP), tracks and failed runs, several ops
/// to a transaction, VIPs shared by holders and moved between them: the kernel takes every
/// transaction, each VIP is fenced and answered exactly as the holders asked, a tracked
/// VIP's own element never outlives its holder's, and no chain outlives its holder.
#[test]
fn every_transaction_is_taken_and_answers_as_the_holders_asked() {
    let vips: [IpAddr; 5] = [
        v4(),
        "192.0.2.11".parse().unwrap(),
        v6(),
        "2001:db8::11".parse().unwrap(),
        "2001:db8::12".parse().unwrap(),
    ];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    for updates in [true, false] {
        let mut rec = Recorded::default();
        let mut kernel = Model::default();
        let mut asked = Asked::default();
        let mut now = Instant::now();
        for step in 0..3000 {
            now += Duration::from_millis(next(700));
            let mut ops = Vec::new();
            for _ in 0..=next(3) {
                let k = 1 + next(3) as usize;
                let vs: Vec<IpAddr> = (0..k).map(|_| vips[next(5) as usize]).collect();
                let change = match next(12) {
                    0..=5 => Change::Refresh(now + Duration::from_millis(next(2500))),
                    6 => Change::Refresh(now - Duration::from_millis(next(50))),
                    7 | 8 => Change::Expire,
                    9 | 10 => Change::Disarm,
                    _ => Change::Track,
                };
                ops.push(op(1 + next(3), &vs, change));
            }
            let p = plan(&ops, &rec, now, updates);
            let lines = p.batch.lines();
            if next(10) == 0 {
                // A failed run: nothing changes, nothing is recorded.
                continue;
            }
            kernel.apply(&lines, now).unwrap_or_else(|e| {
                panic!("step {step} (updates {updates}): refused, {e}\n{ops:?}\n{lines:#?}")
            });
            rec.record(p, now, now);
            for o in &ops {
                asked.op(o, now);
            }
            let tracked: HashSet<IpAddr> = rec.tracked.clone();
            for at in [now, now + Duration::from_millis(1)] {
                for v in vips {
                    assert_eq!(
                        kernel.answered(v, at),
                        asked.answered(v, at),
                        "step {step} (updates {updates}) {v}: {ops:?}\n{lines:#?}\n{asked:?}"
                    );
                    if kernel.per_vip(v, at) {
                        assert!(tracked.contains(&v), "step {step}: {v} untracked, live");
                        assert_eq!(asked.answered(v, at), Some(true), "step {step}: {v}");
                    }
                }
            }
            for o in &ops {
                if let Change::Refresh(until) = o.change
                    && until > now
                {
                    for v in o.vips.iter().filter(|v| tracked.contains(v)) {
                        if asked.answered(*v, now) == Some(true) {
                            assert!(
                                kernel.per_vip(*v, now),
                                "step {step}: tracked {v} refreshed"
                            );
                        }
                    }
                }
            }
            let holders: BTreeSet<String> =
                rec.owners.values().map(|k| holder_chain(k.key)).collect();
            for fam in ["arp", "inet"] {
                let chains: BTreeSet<String> = kernel
                    .chains
                    .iter()
                    .filter(|(f, _)| f == fam)
                    .map(|(_, c)| c.clone())
                    .collect();
                assert_eq!(chains, holders, "step {step}: {fam} chains");
            }
        }
    }
}

/// Egress's view of a VIP that moves between two holders of one node (a shard-count change,
/// a shared address whose governing lease changes) while it is tracked: its own `live4`
/// element follows whichever holder's chain the VIP jumps to, in the same transactions, and
/// once the old holder has let go (its chains gone), the new holder's later refreshes keep
/// it; after the new holder lets go too, the element is gone.
#[test]
fn a_tracked_vip_moved_between_holders_of_one_node_keeps_its_own_element() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    for updates in [true, false] {
        let mut rec = Recorded::default();
        let mut kernel = Model::default();
        let mut step = |rec: &mut Recorded, ops: &[Op], now: Instant| {
            let p = plan(ops, rec, now, updates);
            let lines = p.batch.lines();
            kernel
                .apply(&lines, now)
                .unwrap_or_else(|e| panic!("updates {updates}: refused, {e}\n{lines:#?}"));
            rec.record(p, now, now);
            kernel.clone()
        };
        step(&mut rec, &[refresh(1, &[v4()], t0 + ms(2000))], t0);
        let k = step(&mut rec, &[op(0, &[v4()], Change::Track)], t0);
        assert!(k.per_vip(v4(), t0 + ms(1999)) && !k.per_vip(v4(), t0 + ms(2000)));
        // The second holder takes it over (its own lease), then the first renews once more
        // before it learns, then lets go.
        let at = t0 + ms(500);
        let k = step(&mut rec, &[refresh(2, &[v4()], at + ms(2000))], at);
        assert!(k.per_vip(v4(), at + ms(1999)), "the new holder's end");
        let at = t0 + ms(900);
        step(&mut rec, &[refresh(1, &[v4()], at + ms(1000))], at);
        let at = t0 + ms(1000);
        let k = step(&mut rec, &[op(1, &[v4()], Change::Disarm)], at);
        assert_eq!(k.answered(v4(), t0 + ms(2400)), Some(true));
        assert!(
            k.per_vip(v4(), t0 + ms(2400)),
            "the old holder's disarm sets it from the new holder's end"
        );
        assert!(
            !k.chains.iter().any(|(_, c)| c == "holder_1"),
            "the old holder's chains are gone"
        );
        // The new holder's steady renewals keep it.
        for i in 1..=3u64 {
            let at = t0 + ms(1000 * i + 500);
            let k = step(&mut rec, &[refresh(2, &[v4()], at + ms(2000))], at);
            assert!(k.per_vip(v4(), at + ms(1999)) && !k.per_vip(v4(), at + ms(2000)));
        }
        let at = t0 + ms(4000);
        let k = step(&mut rec, &[op(2, &[v4()], Change::Disarm)], at);
        assert!(!k.per_vip(v4(), at), "let go everywhere: no SNAT");
        assert_eq!(k.answered(v4(), at), None, "not fenced");
        assert!(k.chains.is_empty(), "{:?}", k.chains);
    }
}
