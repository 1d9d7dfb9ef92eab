//! The Python scripts the bench runs beside its own runs (PyTorch's rows,
//! KvikIO's reads): built into the binary, written into a new temporary folder
//! and run from there with `python3`, so that the bench runs them from any
//! folder; each writes its JSON into that folder, which is removed afterwards.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What a script printed and wrote.
pub struct Output {
    /// Its stdout (a table, or a one-line reason it skipped itself).
    pub text: String,
    /// The JSON it wrote, when it wrote one.
    pub json: Option<serde_json::Value>,
    /// Its exit status, or None when it was stopped at the time limit.
    pub status: Option<ExitStatus>,
}

impl Output {
    /// A script that did not run, and why.
    pub fn not_run(why: String) -> Output {
        Output { text: why, json: None, status: None }
    }
}

/// Writes `source` as `name` into a new temporary folder.
pub fn write(name: &str, source: &str) -> std::io::Result<(tempfile::TempDir, PathBuf)> {
    let dir = tempfile::Builder::new().prefix("wirespeed-script-").tempdir()?;
    let path = dir.path().join(name);
    std::fs::write(&path, source)?;
    Ok((dir, path))
}

/// Runs `python3 NAME ARGS --json DIR/results.json` from a temporary folder,
/// its stderr going to ours, its stdout kept; stops it after `limit`.
pub fn run(name: &str, source: &str, args: &[String], env: &[(&str, &str)], limit: Duration) -> Output {
    let (dir, script) = match write(name, source) {
        Ok(d) => d,
        Err(e) => return Output::not_run(format!("skipped: could not write {name} to a temporary folder ({e})")),
    };
    let json_path = dir.path().join("results.json");
    let mut cmd = Command::new("python3");
    cmd.arg(&script).args(args).arg("--json").arg(&json_path).stdin(Stdio::null()).stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_limited(cmd, limit);
    let json = read_json(&json_path);
    match out {
        Err(e) => Output::not_run(format!("skipped: could not run python3 ({e})")),
        Ok((text, status)) => {
            let mut text = text.trim_end().to_string();
            match status {
                None => text.push_str(&format!("\n({name} was stopped after {} s)", limit.as_secs())),
                Some(s) if !s.success() => text.push_str(&format!("\n({name} exited with {s})")),
                Some(_) => {}
            }
            Output { text, json, status }
        }
    } // the folder is removed here
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    std::fs::read(path).ok().and_then(|j| serde_json::from_slice(&j).ok())
}

/// Runs `cmd` (stdout piped), reading its stdout meanwhile; kills it after `limit`.
fn run_limited(mut cmd: Command, limit: Duration) -> std::io::Result<(String, Option<ExitStatus>)> {
    let mut child = cmd.spawn()?;
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(out) = stdout.as_mut() {
            let _ = out.read_to_string(&mut s);
        }
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if Instant::now() >= deadline {
            let _ = child.kill(); // this child only, by its own handle
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = reader.join().unwrap_or_default();
    Ok((text, status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_stops() {
        if Command::new("python3").arg("-c").arg("pass").status().is_err() {
            return; // no python3 here
        }
        let ok = run(
            "t.py",
            "import sys, json\nprint('hello')\njson.dump({'a': 1}, open(sys.argv[-1], 'w'))\n",
            &[],
            &[("X", "1")],
            Duration::from_secs(60),
        );
        assert_eq!(ok.text, "hello");
        assert_eq!(ok.json, Some(serde_json::json!({"a": 1})));
        assert!(ok.status.is_some_and(|s| s.success()));
        let slow = run("s.py", "import time\ntime.sleep(30)\n", &[], &[], Duration::from_millis(300));
        assert!(slow.status.is_none() && slow.text.contains("stopped"), "{}", slow.text);
    }
}
