//! KvikIO's reads of the bench's file into a torch CUDA tensor, in the same
//! run (`bench/kvikio_read.py`, in compatibility mode: POSIX reads through its
//! pinned bounce buffers, no GPUDirect Storage): the best setting of a small
//! sweep, hot (page-cached) and cold (page cache dropped before each read),
//! beside the bench's own rows, for the targets to compare with.

use crate::data::Data;
use crate::results::{Intact, Kind, Row, Sample};
use crate::script::{self, Output};
use crate::session::Bench;
use crate::util::fmt_bytes;
use serde_json::Value;
use std::time::Duration;

/// The script, built into the binary so that the bench runs it from any folder.
pub const SCRIPT: &str = include_str!("../../../../kvikio_read.py");

/// The sweep: KvikIO's num_threads and task_size values, and its bounce buffer size.
pub const THREADS: &str = "8,16";
pub const TASK_SIZES: &str = "4M,16M";
pub const BOUNCE: &str = "4M";
const SETTINGS: u64 = 4;

fn what(mode: &str) -> String {
    let cache = if mode == "hot" { "the page-cached file" } else { "the file, page cache dropped before each read" };
    format!(
        "KvikIO (compatibility mode, no GDS) reads {cache} into a torch CUDA tensor: CuFile.pread, the best of \
         num_threads {{8, 16}} x task_size {{4, 16}} MiB, 4 MiB bounce buffer (bench/kvikio_read.py)"
    )
}

fn skipped_rows(hot: bool, cold: bool, why: &str) -> Vec<Row> {
    [("kvikio-hot", hot), ("kvikio-cold", cold)]
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| Row::skipped(name, Kind::External, &what(&name[7..]), why))
        .collect()
}

/// Runs the script on `data` (hot and/or cold); returns its rows (run, skipped
/// or failed) and what it printed.
pub fn run(b: &mut Bench, data: &Data, hot: bool, cold: bool) -> (Vec<Row>, Option<Output>) {
    if b.gpu.emulated {
        let rows = skipped_rows(hot, cold, "this is an emulated run (KvikIO needs a GPU)");
        rows.iter().for_each(|r| b.finished(r));
        return (rows, None);
    }
    if cold {
        // The script drops the file's pages with posix_fadvise, which keeps the
        // pages mapped into a process: unmap ours from our page tables first.
        if let Err(e) = data.file.drop_page_cache() {
            b.progress.note(&format!("  kvikio: could not drop the bench's own mapping of the file first: {e}"));
        }
    }
    let reps = b.reps.to_string();
    let mut args: Vec<String> = vec![
        "--file".into(),
        data.path.display().to_string(),
        "--size".into(),
        data.len.to_string(),
        "--reps".into(),
        reps.clone(),
        "--threads".into(),
        THREADS.into(),
        "--task-sizes".into(),
        TASK_SIZES.into(),
        "--bounce".into(),
        BOUNCE.into(),
    ];
    if !hot {
        args.push("--no-hot".into());
    }
    if !cold {
        args.push("--no-cold".into());
    }
    b.progress.note(&format!(
        "running KvikIO on the same file: python3 bench/kvikio_read.py --reps {reps} --threads {THREADS} --task-sizes {TASK_SIZES} \
         --bounce {BOUNCE}{}{} (KVIKIO_COMPAT_MODE=ON)",
        if hot { "" } else { " --no-hot" },
        if cold { "" } else { " --no-cold" }
    ));
    // Only a guard against a hung script: every read at 0.25 GB/s, and the imports.
    let reads = SETTINGS * ((b.reps as u64 + 1) * u64::from(hot) + b.reps as u64 * u64::from(cold));
    let limit = Duration::from_secs(180 + reads * data.len / 250_000_000);
    let out = script::run("kvikio_read.py", SCRIPT, &args, &[("KVIKIO_COMPAT_MODE", "ON")], limit);
    let rows = rows_from(&out, hot, cold, data.len);
    rows.iter().for_each(|r| b.finished(r));
    (rows, Some(out))
}

/// The rows of the script's run: from its JSON, or failed or skipped rows
/// that say why there is none.
fn rows_from(out: &Output, hot: bool, cold: bool, len: u64) -> Vec<Row> {
    let Some(doc) = &out.json else {
        let last = out.text.lines().last().unwrap_or("no output").trim();
        return match out.status {
            // Exit 0 without JSON: python3 is there but something is off.
            Some(s) if s.success() => skipped_rows(hot, cold, last),
            _ if out.text.starts_with("skipped") => skipped_rows(hot, cold, &out.text),
            _ => {
                let mut rows = skipped_rows(hot, cold, "");
                for r in &mut rows {
                    r.skipped = None;
                    r.error = Some(format!("kvikio_read.py failed: {last}"));
                }
                rows
            }
        };
    };
    if let Some(why) = doc["skipped"].as_str() {
        return skipped_rows(hot, cold, &format!("KvikIO not run: {why}"));
    }
    [("hot", hot), ("cold", cold)].into_iter().filter(|(_, on)| *on).map(|(mode, _)| row_from(doc, mode, len)).collect()
}

fn count(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The row of `mode` ("hot" or "cold"): the best setting's samples, with
/// every setting's medians and how the data was checked as notes.
fn row_from(doc: &Value, mode: &str, len: u64) -> Row {
    let name = format!("kvikio-{mode}");
    let mut row = Row::new(&name, Kind::External, &what(mode), doc["bytes"].as_u64().unwrap_or(len));
    let Some(best) = doc["best"].get(mode) else {
        row.error = Some(format!("kvikio_read.py wrote no {mode} result"));
        return row;
    };
    row.strategy = format!(
        "KvikIO {} compat mode, num_threads {}, task_size {}, bounce {}",
        doc["kvikio"].as_str().unwrap_or("?"),
        count(&best["num_threads"]),
        fmt_bytes(count(&best["task_size"])),
        fmt_bytes(count(&best["bounce_buffer_size"]))
    );
    row.samples = best["samples"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| {
                    Some(Sample { seconds: s["seconds"].as_f64()?, cpu_seconds: s["cpu_seconds"].as_f64()? })
                })
                .collect()
        })
        .unwrap_or_default();
    row.intact = Intact::Spot {
        ok: best["intact"].as_bool().unwrap_or(false),
        blocks: count(&best["check"]["blocks"]) as usize,
    };
    row.note("every setting (median)", settings(doc, mode).join("; "));
    row.note("settings through", doc["settings_api"].as_str().unwrap_or("?"));
    if mode == "cold" {
        row.note("page cache dropped with", doc["drop_cache"].as_str().unwrap_or("?"));
        if let Some(c) = best["cached_fraction_after_drop"].as_array() {
            let worst = c.iter().filter_map(Value::as_f64).fold(f64::NAN, f64::max);
            if worst.is_finite() {
                row.note("cached after dropping (worst rep)", format!("{:.1} %", worst * 100.0));
            }
        }
    }
    row.note("spot check", format!("{} blocks of 4 KiB compared with os.pread", count(&best["check"]["blocks"])));
    if row.samples.is_empty() {
        row.error = Some("kvikio_read.py wrote no samples".into());
    }
    row
}

/// Every setting of the sweep in `mode`, with its medians.
fn settings(doc: &Value, mode: &str) -> Vec<String> {
    let Some(all) = doc["results"][mode].as_array() else { return Vec::new() };
    all.iter()
        .map(|r| {
            format!(
                "{} thr / {}: {:.2} GB/s, {:.3} CPU s/GB",
                count(&r["num_threads"]),
                fmt_bytes(count(&r["task_size"])),
                r["gbps_median"].as_f64().unwrap_or(f64::NAN),
                r["cpu_s_per_gb_median"].as_f64().unwrap_or(f64::NAN)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_from_json() {
        let doc = serde_json::json!({
            "tool": "kvikio_read.py", "kvikio": "26.02.00", "bytes": 4000, "settings_api": "kvikio.defaults.set",
            "drop_cache": "kvikio.drop_file_page_cache(path)",
            "results": {"hot": [{"num_threads": 8, "task_size": 4194304, "gbps_median": 10.0, "cpu_s_per_gb_median": 0.5}]},
            "best": {"hot": {"num_threads": 8, "task_size": 4194304, "bounce_buffer_size": 4194304,
                     "samples": [{"seconds": 0.5, "cpu_seconds": 0.25}, {"seconds": 0.4, "cpu_seconds": 0.2}],
                     "intact": true, "check": {"blocks": 8}}},
        });
        let out = Output { text: String::new(), json: Some(doc), status: None };
        let rows = rows_from(&out, true, true, 4000);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].name, "kvikio-hot");
        assert!(rows[0].ok() && rows[0].intact == Intact::Spot { ok: true, blocks: 8 });
        assert!(rows[0].strategy.contains("num_threads 8") && rows[0].strategy.contains("4 MiB"));
        assert!(rows[1].error.is_some(), "no cold result is an error");
        let skip = Output { text: "x".into(), json: Some(serde_json::json!({"skipped": "no kvikio"})), status: None };
        let rows = rows_from(&skip, true, false, 1);
        assert_eq!(rows.len(), 1);
        assert!(rows[0].skipped.as_deref().is_some_and(|s| s.contains("no kvikio")));
    }

    /// The built-in script runs from its temporary folder and skips itself
    /// (exit 0, JSON says why) without kvikio, torch or a GPU.
    #[test]
    fn script_runs_or_skips() {
        let (dir, _) = script::write("data.bin", "0123456789").unwrap();
        let file = dir.path().join("data.bin");
        let args = vec!["--file".to_string(), file.display().to_string(), "--reps".into(), "1".into()];
        let out = script::run("kvikio_read.py", SCRIPT, &args, &[], Duration::from_secs(120));
        let Some(status) = out.status else { return }; // no python3 here
        assert!(status.success() || out.json.is_some(), "{}", out.text);
        assert!(out.json.is_some(), "{}", out.text);
    }
}
