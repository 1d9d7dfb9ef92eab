//! The bench's targets: each with what it asks, what this run measured,
//! PASS/MISS (or not measured, and why), and for a miss a measured reason
//! where the bench can tell one.

use crate::results::{Row, find};
use crate::runs::overhead::Overhead;
use crate::runs::{overlap, rows};
use crate::summary::Summary;
use crate::util::{GIB, MIB, fmt_bytes};
use wirespeed_pinned::Strategy;

/// A file at least this large is the "at scale" case (`--size 40G --budget 4G`).
pub const SCALE: u64 = 32 * GIB;
/// The file must be about this many times the pin budget for the page-cached targets.
const RATIO: f64 = 7.95;

/// One target, and how this run did against it.
pub struct Target {
    pub name: &'static str,
    /// What it asks, in words.
    pub target: String,
    /// None: not measured (or only partly) in this run.
    pub pass: Option<bool>,
    /// What this run measured, or why it did not.
    pub measured: String,
    /// For a miss (or a partial measurement): why, as far as the bench can tell.
    pub reason: Option<String>,
}

fn intact_ok(r: &Row) -> bool {
    r.intact.as_bool() != Some(false)
}

fn not_measured(name: &'static str, target: String, why: impl Into<String>) -> Target {
    Target { name, target, pass: None, measured: format!("not measured in this run: {}", why.into()), reason: None }
}

/// Why a named row is missing: skipped, failed, or not selected.
fn absent(rows: &[Row], name: &str) -> String {
    match rows.iter().find(|r| r.name == name) {
        Some(r) if r.error.is_some() => format!("{name} failed: {}", r.error.as_deref().unwrap_or("?")),
        Some(r) if r.skipped.is_some() => format!("{name} skipped: {}", r.skipped.as_deref().unwrap_or("?")),
        _ => format!("{name} did not run (see --only, --no-cold)"),
    }
}

/// What a row of the file measured, for a target: its strategy and repetitions,
/// the fraction of the line rate (slowest, fastest) and GB/s, CPU seconds per
/// GB (min-max), peak pinned bytes and whether the data arrived intact.
fn stream_measured(r: &Row, lr: f64) -> String {
    let (f, c, g) = (r.fractions(lr), r.cpu_stats(), r.gbps());
    format!(
        "{} [{}], {} rep(s): {:.3} of the line rate (slowest {:.3}, fastest {:.3}) = {:.2} GB/s; {:.3} CPU s/GB \
         ({:.3}-{:.3}); peak pinned {}; intact: {}",
        r.name,
        r.strategy,
        r.samples.len(),
        f.median,
        f.min,
        f.max,
        g.median,
        c.median,
        c.min,
        c.max,
        fmt_bytes(r.peak_pinned),
        r.intact.short()
    )
}

/// Threads that do the work of a library row (ring fillers, the window thread, readers).
fn workers(s: Option<Strategy>) -> Option<usize> {
    match s? {
        Strategy::Ring { threads, .. } | Strategy::Direct { threads, .. } => Some(threads),
        Strategy::Hybrid { threads, .. } => Some(threads + 1),
        Strategy::Windows { .. } | Strategy::WholeFile => Some(1),
        _ => None, // Auto, or a strategy this bench does not know
    }
}

/// How the bytes of a library row were split between windows and the ring.
fn split(r: &Row) -> Option<(f64, String)> {
    match r.resolved? {
        Strategy::Hybrid { threads, .. } if r.breakdown.is_some() => {
            let (_, b) = r.breakdown?;
            let win = b.in_place_fraction();
            Some((
                1.0 - win,
                format!(
                    "the windows carried {:.0} % of the bytes, the ring ({threads} threads) {:.0} % (the median \
                     repetition's report)",
                    win * 100.0,
                    (1.0 - win) * 100.0
                ),
            ))
        }
        Strategy::Hybrid { window, threads, .. } => {
            let regs = r.registrations.unwrap_or(0);
            let win = (regs.saturating_mul(window as u64)).min(r.bytes) as f64 / r.bytes.max(1) as f64;
            Some((
                1.0 - win,
                format!(
                    "the windows carried about {:.0} % of the bytes ({regs} registrations of {} per pass), the ring \
                     ({threads} threads) about {:.0} %",
                    win * 100.0,
                    fmt_bytes(window as u64),
                    (1.0 - win) * 100.0
                ),
            ))
        }
        Strategy::Ring { threads, .. } => Some((1.0, format!("the ring carried every byte ({threads} threads)"))),
        Strategy::Windows { .. } | Strategy::WholeFile => Some((0.0, "registered memory carried every byte".into())),
        _ => None,
    }
}

/// Why a page-cached library row missed: CPU-bound or not, the split, the
/// CPU the ring costs, the slowest repetitions.
fn stream_reason(s: &Summary, r: &Row, frac_min: f64, cpu_max: f64, slowest_min: Option<f64>) -> String {
    let lr = s.line_rate;
    let (f, cpu) = (r.fractions(lr), r.cpu_per_gb());
    let mut why = Vec::new();
    let cores = r.cores_busy();
    let ring_share = split(r).map(|(share, text)| {
        why.push(text);
        share
    });
    if f.median < frac_min {
        match workers(r.resolved) {
            Some(w) if cores >= 0.8 * w as f64 => why.push(format!(
                "CPU-bound: {cores:.1} cores busy on average for {w} worker thread(s), {:.1} GB/s per busy core",
                r.gbps().median / cores.max(1e-9)
            )),
            Some(w) => why.push(format!(
                "not CPU-bound ({cores:.1} cores busy on average for {w} worker thread(s)): it waits on copies, \
                 registrations or unregistrations, not on the memcpy"
            )),
            None => why.push(format!("{cores:.1} cores busy on average")),
        }
        if let (Some(m), Some(share)) = (s.file.as_ref().and_then(|f| f.mem), ring_share)
            && share > 0.0
        {
            why.push(format!(
                "on this host one thread alone copies the page-cached file at {:.1} GB/s ({:.3} CPU s/GB) and all \
                 {} threads read it at {:.1} GB/s (the memory anchors of this run)",
                m.copy_one / 1e9,
                1e9 / m.copy_one.max(1.0),
                s.threads,
                m.read_all / 1e9
            ));
        }
        if let Some(text) = time_went(r, frac_min * lr) {
            why.push(text);
        }
        let hybrid = matches!(r.resolved, Some(Strategy::Hybrid { .. }));
        if let (true, Some(w)) = (hybrid, find(s.rows, "windows")) {
            why.push(format!("windows alone reached {:.2} of the line rate here", w.fraction(lr)));
        }
    }
    if cpu > cpu_max {
        match (ring_share, find(s.rows, "ring-cache").filter(|rc| rc.name != r.name)) {
            (Some(share), Some(rc)) if share > 0.0 => why.push(format!(
                "{cpu:.3} CPU s/GB: the ring alone costs {:.3} CPU s/GB here (ring-cache), so its {:.0} % share \
                 accounts for about {:.3}",
                rc.cpu_per_gb(),
                share * 100.0,
                share * rc.cpu_per_gb()
            )),
            (Some(share), _) if share > 0.0 => why.push(format!(
                "{cpu:.3} CPU s/GB: the CPU copies every byte the ring carries ({:.0} % of them) with memcpy",
                share * 100.0
            )),
            _ => why.push(format!("{cpu:.3} CPU s/GB ({cores:.1} cores busy on average)")),
        }
    }
    if let Some(m) = slowest_min
        && f.min < m
    {
        let reps: Vec<String> =
            r.samples.iter().map(|x| format!("{:.3}", r.bytes as f64 / x.seconds / 1e9 / lr)).collect();
        why.push(format!("slowest repetition {:.3} (each, in order: {})", f.min, reps.join(", ")));
    }
    if !intact_ok(r) {
        why.push("the data arrived damaged".into());
    }
    why.join("; ")
}

/// What bound the median repetition of a hybrid row, from its report's
/// breakdown: the share of the pass the window thread spent registering and
/// unregistering, and the share of the ring threads' time spent filling slots
/// and waiting for them (waiting = the copy engine was behind); then, from
/// the rates the two halves ran at, how many ring threads `need_gbps` would
/// take beside the window thread.
fn time_went(r: &Row, need_gbps: f64) -> Option<String> {
    let (seconds, b) = r.breakdown?;
    let Some(Strategy::Hybrid { threads, .. }) = r.resolved else { return None };
    let wall = seconds.max(1e-12);
    let reg = (b.register_seconds + b.unregister_seconds) / wall;
    let ring_time = wall * threads.max(1) as f64;
    let (fill, wait) = (b.fill_seconds / ring_time, b.slot_wait_seconds / ring_time);
    let bound = match (reg >= 0.8, fill >= 0.8) {
        (true, true) => "both halves are CPU work (registering, memcpy), not the copy engine",
        (true, false) => "the window thread's registering bounds it",
        (false, true) => "the ring's memcpy bounds it",
        (false, false) if wait >= 0.3 => "the copy engine bounds it (the ring waits for free slots)",
        (false, false) => "neither agent is busy all the time",
    };
    let mut text = format!(
        "in the median repetition the window thread spent {:.0} % of the pass registering and unregistering, \
         the {threads} ring threads {:.0} % of theirs filling slots and {:.0} % waiting for free ones: {bound}",
        reg * 100.0,
        fill * 100.0,
        wait * 100.0
    );
    if let (Some(rw), Some(rf)) = (b.register_rate(), b.fill_rate()) {
        let (rw, rf) = (rw / 1e9, rf / 1e9);
        text.push_str(&format!(
            "; it registered at {rw:.1} GB/s (one thread: the driver registers one call at a time for the device) \
             and each ring thread filled {rf:.1} GB/s, so {need_gbps:.1} GB/s would take {:.1} ring threads \
             beside the window thread at these rates (it ran {threads}{})",
            ((need_gbps - rw) / rf).max(0.0),
            match b.reserve_threads {
                0 => String::new(),
                n => format!(", and {n} reserve thread(s) joined during the pass"),
            }
        ));
    }
    Some(text)
}

fn page_cached(s: &Summary, scale: bool) -> Target {
    let (name, target) = if scale {
        ("page-cached file at scale", ">= 0.90 of the line rate at <= 0.10 CPU s/GB (median), auto, a file of 32 GiB or more 8x the budget (--size 40G --budget 4G)".to_string())
    } else {
        (
            "page-cached file 8x the budget",
            format!(
                ">= 0.90 of the line rate at <= 0.10 CPU s/GB, auto, median of >= {} repetitions, slowest >= 0.85 (4 GiB file, 512 MiB budget)",
                crate::args::TARGET_REPS
            ),
        )
    };
    let Some(f) = &s.file else { return not_measured(name, target, "no file was streamed") };
    let ratio = f.bytes as f64 / f.budget as f64;
    if ratio < RATIO {
        return not_measured(
            name,
            target,
            format!("the file is {ratio:.1}x the pin budget, not 8x (leave --budget at its default)"),
        );
    }
    if (f.bytes >= SCALE) != scale {
        let why = if scale {
            format!("the file is {}; run --size 40G --budget 4G --only auto", fmt_bytes(f.bytes))
        } else {
            format!("the file is {}: this run measures the target at scale instead", fmt_bytes(f.bytes))
        };
        return not_measured(name, target, why);
    }
    let Some(r) = find(s.rows, "auto") else { return not_measured(name, target, absent(s.rows, "auto")) };
    let (fr, cpu) = (r.fractions(s.line_rate), r.cpu_per_gb());
    let slowest = (!scale).then_some(0.85);
    let enough = scale || r.samples.len() >= crate::args::TARGET_REPS;
    let met = fr.median >= 0.90 && cpu <= 0.10 && slowest.is_none_or(|m| fr.min >= m) && intact_ok(r);
    let pass = if enough { Some(met) } else { None };
    let mut reason = (!met).then(|| stream_reason(s, r, 0.90, 0.10, slowest));
    if !enough {
        let few = format!("only {} repetition(s): the target needs >= {}", r.samples.len(), crate::args::TARGET_REPS);
        reason = Some(reason.map_or(few.clone(), |x| format!("{few}; {x}")));
    }
    Target { name, target, pass, measured: stream_measured(r, s.line_rate), reason }
}

fn ring_alone(s: &Summary) -> Target {
    let name = "ring alone";
    let target = ">= 0.90 of the line rate at <= 0.15 CPU s/GB with <= 128 MiB pinned (ring-cache: Ring { slots: 32, slot: 4 MiB, threads: 8 })".to_string();
    if s.file.is_none() {
        return not_measured(name, target, "no file was streamed");
    }
    let Some(r) = find(s.rows, "ring-cache") else { return not_measured(name, target, absent(s.rows, "ring-cache")) };
    let (f, cpu) = (r.fraction(s.line_rate), r.cpu_per_gb());
    let met = f >= 0.90 && cpu <= 0.15 && r.peak_pinned <= 128 * MIB && intact_ok(r);
    let mut reason = (!met).then(|| stream_reason(s, r, 0.90, 0.15, None));
    if r.peak_pinned > 128 * MIB {
        reason = reason.map(|x| format!("{x}; {} pinned", fmt_bytes(r.peak_pinned)));
    }
    Target { name, target, pass: Some(met), measured: stream_measured(r, s.line_rate), reason }
}

fn cpu_rows(s: &Summary) -> Target {
    let name = "CPU-produced rows through the ring";
    let target = ">= 0.85 of the line rate at <= half of PyTorch's per-row pin_memory().cuda(non_blocking=True) CPU time, same run (rows-ring-mt: 1024 rows of 2.5 MiB, pageable)".to_string();
    let Some(r) = find(s.pytorch_rows, "rows-ring-mt") else {
        let why = if s.pytorch_rows.is_empty() {
            "--pytorch-rows was not given".into()
        } else {
            absent(s.pytorch_rows, "rows-ring-mt")
        };
        return not_measured(name, target, why);
    };
    let lr = s.line_rate;
    let (f, cpu_s, cores) = (r.fraction(lr), r.cpu_seconds(), r.cores_busy());
    let threads = r.note_value("threads").unwrap_or("?");
    let mut measured = format!(
        "rows-ring-mt ({threads} threads, {} rep(s)): {:.3} of the line rate = {:.2} GB/s, {:.1} ms CPU for {} ({:.3} CPU s/GB, \
         {cores:.1} cores busy; the reserve thread joined in {}); intact: {}",
        r.samples.len(),
        f,
        r.gbps().median,
        cpu_s * 1e3,
        fmt_bytes(r.bytes),
        r.cpu_per_gb(),
        r.note_value(rows::RESERVE_JOINED).unwrap_or("? rep(s)"),
        r.intact.short()
    );
    let torch = s.torch.and_then(rows::torch_pin_nb);
    let torch_bytes = s.torch.and_then(|t| t.json.as_ref()?.get("bytes")?.as_u64());
    let Some(((_, t_cpu), t_bytes)) = torch.zip(torch_bytes) else {
        let why = s.torch.map_or("torch_rows.py did not run".to_string(), |t| {
            format!("torch_rows.py: {}", t.text.lines().next().unwrap_or("no output"))
        });
        let mut why = vec![format!("PyTorch's per-row pin_memory() was not measured in this run ({why})")];
        // The rate part misses without PyTorch's run too.
        let missed = f < 0.85 || !intact_ok(r);
        if f < 0.85 {
            why.extend(rows_bound(r, lr));
        }
        let pass = missed.then_some(false);
        return Target { name, target, pass, measured, reason: Some(why.join("; ")) };
    };
    // Per GB, in case the two moved different amounts.
    let (ours, theirs) = (r.cpu_per_gb(), t_cpu / (t_bytes as f64 / 1e9));
    measured.push_str(&format!(
        "; PyTorch's per-row pin_memory().cuda(non_blocking=True): {:.1} ms CPU ({theirs:.3} CPU s/GB): ours is {:.2} of it",
        t_cpu * 1e3,
        ours / theirs
    ));
    let met = f >= 0.85 && ours <= 0.5 * theirs && intact_ok(r);
    let reason = (!met).then(|| {
        let mut why = Vec::new();
        if f < 0.85 {
            why.extend(rows_bound(r, lr));
        }
        if ours > 0.5 * theirs {
            why.push(format!("CPU {ours:.3} s/GB against PyTorch's {theirs:.3}"));
        }
        if !intact_ok(r) {
            why.push("the data arrived damaged".into());
        }
        why.join("; ")
    });
    Target { name, target, pass: Some(met), measured, reason }
}

/// What bounded rows-ring-mt: its ring threads' memcpy (CPU-bound; the
/// reserve joined them then), or the copies (they waited for free slots),
/// with the start's memory anchors and what they allow.
fn rows_bound(r: &Row, lr: f64) -> Vec<String> {
    let cores = r.cores_busy();
    let threads = r.note_value("threads").unwrap_or("?");
    let n: f64 = threads.parse().unwrap_or(f64::NAN);
    let joined = r.note_value(rows::RESERVE_JOINED).unwrap_or("? rep(s)");
    let num = |name| r.note_value(name).and_then(|v| v.parse::<f64>().ok());
    let waited = num(rows::SLOT_WAIT).map(|w| format!("{:.0} %", w * 100.0)).unwrap_or_else(|| "?".into());
    let mut why = vec![if cores >= 0.8 * n {
        format!(
            "CPU-bound, by the ring threads' row memcpy: {cores:.1} cores busy on average for {threads} threads and \
             the reserve (it joined in {joined}), {:.1} GB/s per busy core; the ring threads waited for free slots \
             {waited} of their time",
            r.gbps().median / cores.max(1e-9)
        )
    } else {
        format!(
            "not CPU-bound ({cores:.1} cores busy for {threads} threads; the reserve joined in {joined}): the copies \
             of 2.5 MiB rows, one stream, are what it waits on (the ring threads waited for free slots {waited} of \
             their time)"
        )
    }];
    if let (Some(one), Some(all)) = (num(rows::ANCHOR_COPY_ONE), num(rows::ANCHOR_READ_ALL)) {
        let fill = (n + 1.0) * one;
        let (cap, by) = if fill < all {
            (fill, format!("the memcpy: {threads} threads and the reserve at the one-thread rate"))
        } else {
            (all, "host memory: what all the filler threads read".to_string())
        };
        why.push(format!(
            "this start's memory anchors: one thread copies the rows into a slot at {one:.1} GB/s ({:.3} CPU s/GB) \
             and {} threads read them at {all:.1} GB/s; so the rows can be filled at about {cap:.1} GB/s = {:.2} of \
             the line rate at most, bound by {by}",
            1.0 / one.max(1e-9),
            r.note_value(rows::ANCHOR_THREADS).unwrap_or("?"),
            cap / lr
        ));
    }
    why
}

fn cold(s: &Summary) -> Target {
    let name = "cold file";
    let target =
        ">= 0.95 of the best parallel O_DIRECT read rate of the same disk, and >= KvikIO's cold rate, same run"
            .to_string();
    if s.file.is_none() {
        return not_measured(name, target, "no file was streamed");
    }
    let Some(d) = find(s.rows, "disk-direct") else { return not_measured(name, target, absent(s.rows, "disk-direct")) };
    let Some(c) = ["cold-auto", "cold-direct"]
        .iter()
        .filter_map(|n| find(s.rows, n))
        .max_by(|a, b| a.gbps().median.total_cmp(&b.gbps().median))
    else {
        return not_measured(name, target, absent(s.rows, "cold-auto"));
    };
    let (cg, dg) = (c.gbps().median, d.gbps().median);
    let disk_ok = cg >= 0.95 * dg && intact_ok(c);
    let mut measured = format!(
        "best cold run {} [{}]: {cg:.2} GB/s = {:.3} of the disk's {dg:.2} GB/s (O_DIRECT, threads: {}), {:.3} CPU s/GB",
        c.name,
        c.strategy,
        cg / dg,
        d.note_value("threads").unwrap_or("?"),
        c.cpu_per_gb()
    );
    let mut why = Vec::new();
    if !disk_ok {
        why.push(format!(
            "{} read with {} worker thread(s) where the disk gave its best with {}; {:.1} cores busy",
            c.name,
            workers(c.resolved).map_or("?".into(), |w| w.to_string()),
            d.note_value("threads").unwrap_or("?"),
            c.cores_busy()
        ));
    }
    let pass = match find(s.rows, "kvikio-cold") {
        Some(k) => {
            let kg = k.gbps().median;
            measured.push_str(&format!("; KvikIO cold {kg:.2} GB/s [{}]: ours is {:.2}x", k.strategy, cg / kg));
            if cg < kg {
                why.push(format!("KvikIO's cold read is faster ({kg:.2} GB/s)"));
            }
            Some(disk_ok && cg >= kg)
        }
        None => {
            why.push(format!(
                "KvikIO's cold rate was not measured ({}); the disk part is {}",
                absent(s.rows, "kvikio-cold"),
                if disk_ok { "met" } else { "missed" }
            ));
            if disk_ok { None } else { Some(false) }
        }
    };
    let reason = (pass != Some(true) && !why.is_empty()).then(|| why.join("; "));
    Target { name, target, pass, measured, reason }
}

fn kvikio_hot(s: &Summary) -> Target {
    let name = "against KvikIO, hot";
    let target = ">= 1.05x KvikIO's best GB/s at <= 1/3 of its CPU s/GB, page-cached file, same run (auto)".to_string();
    if s.file.is_none() {
        return not_measured(name, target, "no file was streamed");
    }
    let Some(a) = find(s.rows, "auto") else { return not_measured(name, target, absent(s.rows, "auto")) };
    let Some(k) = find(s.rows, "kvikio-hot") else { return not_measured(name, target, absent(s.rows, "kvikio-hot")) };
    let (ag, kg, ac, kc) = (a.gbps().median, k.gbps().median, a.cpu_per_gb(), k.cpu_per_gb());
    let measured = format!(
        "auto [{}] {ag:.2} GB/s at {ac:.3} CPU s/GB; KvikIO hot [{}] {kg:.2} GB/s at {kc:.3} CPU s/GB: {:.2}x its rate at \
         {:.2} of its CPU s/GB",
        a.strategy,
        k.strategy,
        ag / kg,
        ac / kc
    );
    let met = ag >= 1.05 * kg && ac <= kc / 3.0 && intact_ok(a);
    let reason = (!met).then(|| {
        let mut why = Vec::new();
        if ag < 1.05 * kg {
            why.push(format!("rate {:.2}x of KvikIO's (needs 1.05x)", ag / kg));
        }
        if ac > kc / 3.0 {
            why.push(format!("CPU {:.2} of KvikIO's (needs <= 0.33)", ac / kc));
        }
        why.join("; ")
    });
    Target { name, target, pass: Some(met), measured, reason }
}

fn registered_once(s: &Summary) -> Target {
    let name = "registered once, copied again";
    let target = ">= 0.98 of the line rate for data within the pin budget, registered once (budget-reuse)".to_string();
    if s.file.is_none() {
        return not_measured(name, target, "no file was streamed");
    }
    let Some(r) = find(s.rows, "budget-reuse") else {
        return not_measured(name, target, absent(s.rows, "budget-reuse"));
    };
    let lr = s.line_rate;
    let frac = r.fraction(lr);
    let met = frac >= 0.98 && intact_ok(r);
    let measured = format!(
        "{} within the budget: {:.2} GB/s = {frac:.3} of the line rate; a pass takes {:.2} ms, {:.2} ms more than the \
         line rate needs",
        fmt_bytes(r.bytes),
        r.gbps().median,
        r.seconds() * 1e3,
        (r.seconds() - r.bytes as f64 / (lr * 1e9)) * 1e3
    );
    Target { name, target, pass: Some(met), measured, reason: None }
}

fn overhead(s: &Summary) -> Target {
    let name = "safe-layer overhead";
    let target = format!("<= {} % CPU per 64 KiB async copy, cuda-safe against raw cuda-sys", Overhead::TARGET_PCT);
    let Some(o) = s.overhead else {
        return not_measured(name, target, "the overhead run was not asked for (--overhead)");
    };
    Target {
        name,
        target,
        pass: Some(o.pct <= Overhead::TARGET_PCT),
        measured: format!(
            "cuda-safe {:.3} us vs raw {:.3} us CPU per copy: {:+.1} % (median over {} rounds of safe / raw in the same round)",
            o.safe_cpu_us.median, o.raw_cpu_us.median, o.pct, o.rounds
        ),
        reason: None,
    }
}

fn overlap(s: &Summary) -> Target {
    let name = "overlap";
    let target = format!(
        "batches streamed into a caller-owned arena while the caller's stream works on each landed batch \
         (device-to-device copies, k calibrated to take as long as the streaming): wall <= {:.2}x max(stream alone, \
         compute alone)",
        overlap::TARGET_RATIO
    );
    if s.file.is_none() {
        return not_measured(name, target, "no file was streamed");
    }
    let Some(o) = s.overlap else { return not_measured(name, target, "overlap did not run (see --only)") };
    if let Some(e) = &o.error {
        return not_measured(name, target, format!("overlap failed: {e}"));
    }
    if let Some(why) = &o.skipped {
        return not_measured(name, target, format!("overlap skipped: {why}"));
    }
    let (st, c, b) = (o.stream(), o.compute(), o.both());
    let r = o.ratios();
    let measured = format!(
        "{} batches of {}, k = {}, {} rep(s): both {:.1} ms, stream alone {:.1} ms, compute alone {:.1} ms: {:.3} of \
         the longer (per repetition {:.3}-{:.3}); intact: {}",
        o.batches,
        fmt_bytes(o.batch),
        o.k,
        o.both_s.len(),
        b.median * 1e3,
        st.median * 1e3,
        c.median * 1e3,
        o.ratio(),
        r.min,
        r.max,
        o.intact.short()
    );
    let pass = o.pass();
    let reason = (pass == Some(false)).then(|| {
        let mut why = Vec::new();
        let lost = (b.median - st.median.max(c.median)) * 1e3;
        why.push(format!(
            "overlapping cost {lost:.1} ms over the longer alone, of {:.1} ms that running them one after the other would add",
            st.median.min(c.median) * 1e3
        ));
        let bal = o.balance();
        if !(0.8..=1.25).contains(&bal) {
            why.push(format!(
                "calibration missed: compute alone is {bal:.2}x the streaming alone (k = {}{})",
                o.k,
                if o.k >= overlap::MAX_K { ", the cap" } else { "" }
            ));
        }
        if let Some(n) = o.registrations.filter(|&n| n > 0) {
            why.push(registrations_reason(&o.strategy, n, o.windows.as_ref()));
        }
        if o.intact.as_bool() == Some(false) {
            why.push("the data arrived damaged".into());
        }
        why.join("; ")
    });
    Target { name, target, pass, measured, reason }
}

/// What the overlap row's registrations say about a miss. In the primary
/// context unregistering waits for every copy on the device, the caller's
/// included; elsewhere (a second context, where the streamer registers when
/// it can) it does not, but the driver registers one call at a time for the
/// whole device, slower while copies are in flight.
fn registrations_reason(strategy: &str, n: u64, windows: Option<&wirespeed_pinned::WindowContext>) -> String {
    match windows {
        Some(wirespeed_pinned::WindowContext::PrimaryContext { reason }) => format!(
            "the streamer ran {strategy} and made {n} registration(s) per pass in the primary context ({reason}): \
             there cudaHostUnregister waits for every copy in flight on the device, the caller's included"
        ),
        _ => format!(
            "the streamer ran {strategy} and made {n} registration(s) per pass: registering and unregistering take \
             the streamer's thread, one call at a time for the whole device, and run slower while copies are in \
             flight"
        ),
    }
}

/// Every target, in the order of the bench's list.
pub fn all(s: &Summary) -> Vec<Target> {
    vec![
        page_cached(s, false),
        page_cached(s, true),
        ring_alone(s),
        cpu_rows(s),
        cold(s),
        kvikio_hot(s),
        registered_once(s),
        overlap(s),
        overhead(s),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Kind;

    fn hybrid_row(register: f64, fill: f64, wait: f64) -> Row {
        let mut r = Row::new("auto", Kind::Stream, "auto", 4 << 30);
        r.resolved = Some(Strategy::Hybrid { window: 111 << 20, slot: 4 << 20, threads: 4 });
        let mut b = wirespeed_pinned::Breakdown::default();
        (b.in_place_bytes, b.ring_bytes) = (1 << 30, 3 << 30);
        (b.register_seconds, b.fill_seconds, b.slot_wait_seconds) = (register, fill, wait);
        r.breakdown = Some((0.1, b));
        r
    }

    fn rows_row(cores: f64, joined: &str, anchors: Option<(f64, f64)>) -> Row {
        let mut r = Row::new("rows-ring-mt", Kind::Rows, "rows", 2560 << 20);
        r.samples.push(crate::results::Sample { seconds: 0.1, cpu_seconds: 0.1 * cores });
        r.note("threads", "8");
        r.note(rows::RESERVE_JOINED, joined);
        r.note(rows::SLOT_WAIT, "0.040");
        if let Some((one, all)) = anchors {
            r.note(rows::ANCHOR_COPY_ONE, format!("{one}"));
            r.note(rows::ANCHOR_READ_ALL, format!("{all}"));
            r.note(rows::ANCHOR_THREADS, "16");
        }
        r
    }

    #[test]
    fn the_rows_reason_names_the_bound_with_the_anchors() {
        let memcpy = rows_bound(&rows_row(8.5, "3 of 3 rep(s)", Some((4.2, 60.0))), 52.0).join("; ");
        assert!(memcpy.contains("CPU-bound, by the ring threads' row memcpy"), "{memcpy}");
        assert!(memcpy.contains("the reserve (it joined in 3 of 3 rep(s))"), "{memcpy}");
        assert!(memcpy.contains("waited for free slots 4 % of their time"), "{memcpy}");
        // 9 threads at 4.2 GB/s: 37.8 GB/s = 0.73 of 52, below what 16 threads read.
        assert!(memcpy.contains("one thread copies the rows into a slot at 4.2 GB/s"), "{memcpy}");
        assert!(memcpy.contains("about 37.8 GB/s = 0.73 of the line rate at most, bound by the memcpy"), "{memcpy}");
        let memory = rows_bound(&rows_row(8.5, "3 of 3 rep(s)", Some((8.0, 40.0))), 52.0).join("; ");
        assert!(memory.contains("about 40.0 GB/s = 0.77 of the line rate at most, bound by host memory"), "{memory}");
        let copies = rows_bound(&rows_row(2.0, "0 of 3 rep(s)", None), 52.0);
        assert_eq!(copies.len(), 1, "no anchors, no second part");
        assert!(copies[0].starts_with("not CPU-bound (2.0 cores busy for 8 threads; the reserve joined in 0 of 3"));
    }

    #[test]
    fn the_breakdown_names_what_bound_a_hybrid_pass() {
        let both = time_went(&hybrid_row(0.09, 0.36, 0.02), 49.5).unwrap();
        assert!(both.contains("spent 90 %") && both.contains("90 % of theirs filling"), "{both}");
        assert!(both.contains("both halves are CPU work"), "{both}");
        // 1 GiB registered in 90 ms: 11.9 GB/s; 3 GiB filled in 360 ms of ring threads: 8.9 GB/s a thread;
        // 49.5 GB/s would take (49.5 - 11.9) / 8.9 = 4.2 ring threads.
        assert!(both.contains("registered at 11.9 GB/s") && both.contains("filled 8.9 GB/s"), "{both}");
        assert!(both.contains("would take 4.2 ring threads") && both.contains("(it ran 4)"), "{both}");
        let engine = time_went(&hybrid_row(0.03, 0.15, 0.2), 49.5).unwrap();
        assert!(engine.contains("the copy engine bounds it"), "{engine}");
        let (share, text) = split(&hybrid_row(0.0, 0.0, 0.0)).unwrap();
        assert_eq!(share, 0.75);
        assert!(text.starts_with("the windows carried 25 % of the bytes"), "{text}");
        let mut ring = hybrid_row(0.0, 0.0, 0.0);
        ring.resolved = Some(Strategy::Ring { slots: 8, slot: 4 << 20, threads: 4 });
        assert!(time_went(&ring, 49.5).is_none());
    }

    #[test]
    fn the_overlap_reason_says_where_registrations_were_made() {
        use wirespeed_pinned::WindowContext;
        let primary = WindowContext::PrimaryContext { reason: "turned off".into() };
        let text = registrations_reason("whole-file", 64, Some(&primary));
        assert!(
            text.contains("in the primary context (turned off)") && text.contains("the caller's included"),
            "{text}"
        );
        for w in [None, Some(&WindowContext::SecondContext), Some(&WindowContext::None)] {
            let text = registrations_reason("whole-file", 64, w);
            assert!(text.contains("64 registration(s) per pass") && !text.contains("waits for every copy"), "{text}");
        }
    }
}
