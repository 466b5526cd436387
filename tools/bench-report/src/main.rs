//! Turns criterion results into the benchmark table and chart of BENCHMARKS.md.
//!
//! Usage: `bench-report [--criterion DIR] [--markdown FILE] [--svg FILE]`.

mod chart;
#[cfg(test)]
mod tests;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::path::{Path, PathBuf};

type Result<T> = std::result::Result<T, String>;

const START_MARKER: &str = "<!-- bench-report:start -->";
const END_MARKER: &str = "<!-- bench-report:end -->";
const USAGE: &str =
    "usage: bench-report [--criterion DIR] [--markdown BENCHMARKS.md] [--svg BENCHMARKS.svg]";

/// Which way a row's ratio is good, or an absolute value for the footprint row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// ratio = idem time / baseline time; met when ratio <= target.
    Cost,
    /// ratio = baseline time / idem time; met when ratio >= target.
    Throughput,
    /// idem bytes per record; met when <= target.
    Bytes,
}

/// One hard-coded comparison of two criterion functions in one group.
struct Comparison {
    group: &'static str,
    baseline: &'static str,
    idem: &'static str,
    label: &'static str,
    short: &'static str,
    target: f64,
    kind: Kind,
}

const fn cmp(
    group: &'static str,
    baseline: &'static str,
    idem: &'static str,
    label: &'static str,
    short: &'static str,
    target: f64,
    kind: Kind,
) -> Comparison {
    Comparison { group, baseline, idem, label, short, target, kind }
}

use Kind::{Cost, Throughput};
/// The comparisons and targets BENCHMARKS.md reports, in table order.
#[rustfmt::skip]
const COMPARISONS: &[Comparison] = &[
    cmp("memory_replay_checked", "baseline", "idem", "memory replay via the macro vs a hand-written check that also compares the request's JSON", "memory replay, payload checked", 1.5, Cost),
    cmp("memory_replay", "baseline", "idem_fingerprint_none", "memory replay with `fingerprint = none` vs hand-written DashMap + same codec", "memory replay, fingerprint = none", 1.5, Cost),
    cmp("memory_first_call", "baseline", "idem", "memory first call via the macro vs hand-written insert + encode", "memory first call", 2.0, Cost),
    cmp("local_cache_replay", "cached", "idem", "memory replay via the macro with the local cache (`clone_cached`) vs `#[cached]` hit", "local-cache replay", 1.5, Cost),
    cmp("redis_replay_1", "baseline", "idem", "Redis replay vs raw GET + decode, 1 caller", "Redis replay, 1 caller", 0.9, Throughput),
    cmp("redis_replay_32", "baseline", "idem", "Redis replay vs raw GET + decode, 32 callers", "Redis replay, 32 callers", 0.9, Throughput),
    cmp("redis_first_call", "baseline", "idem", "Redis first call vs raw SET", "Redis first call", 0.45, Throughput),
    cmp("postgres_replay_1", "baseline", "idem", "Postgres replay vs raw SELECT + decode, 1 caller", "Postgres replay, 1 caller", 0.85, Throughput),
    cmp("postgres_replay_16", "baseline", "idem", "Postgres replay vs raw SELECT + decode, 16 callers", "Postgres replay, 16 callers", 0.85, Throughput),
    cmp("postgres_first_call", "baseline", "idem", "Postgres first call vs raw INSERT", "Postgres first call", 0.5, Throughput),
    cmp("mysql_replay_1", "baseline", "idem", "MySQL replay vs raw SELECT + decode, 1 caller", "MySQL replay, 1 caller", 0.85, Throughput),
    cmp("mysql_replay_16", "baseline", "idem", "MySQL replay vs raw SELECT + decode, 16 callers", "MySQL replay, 16 callers", 0.85, Throughput),
    cmp("mysql_first_call", "baseline", "idem", "MySQL first call vs raw INSERT", "MySQL first call", 0.5, Throughput),
    cmp("memory_scaling", "threads_1", "threads_2", "memory store calls/s, 2 threads vs 1", "memory calls/s, 2 threads vs 1", 1.7, Throughput),
];
/// Ceiling on the memory store's bytes per record.
const FOOTPRINT_TARGET: f64 = 200.0;

/// One line of the report; `values` is `None` when the benchmark did not run.
#[derive(Clone, Debug)]
pub struct Row {
    pub label: String,
    pub short: &'static str,
    pub kind: Kind,
    pub target: f64,
    /// (baseline, idem): median ns per iteration, or bytes per record for `Kind::Bytes`.
    pub values: Option<(f64, f64)>,
}

impl Row {
    /// The ratio oriented as the row's kind says; `None` if not run or absolute.
    pub fn ratio(&self) -> Option<f64> {
        let (baseline, idem) = self.values?;
        match self.kind {
            Kind::Cost => Some(idem / baseline),
            Kind::Throughput => Some(baseline / idem),
            Kind::Bytes => None,
        }
    }

    /// Whether the target is met; `None` if not run.
    pub fn met(&self) -> Option<bool> {
        let (_, idem) = self.values?;
        Some(match self.kind {
            Kind::Cost => self.ratio()? <= self.target,
            Kind::Throughput => self.ratio()? >= self.target,
            Kind::Bytes => idem <= self.target,
        })
    }
}

#[derive(Deserialize)]
struct Estimates {
    median: Estimate,
}
#[derive(Deserialize)]
struct Estimate {
    point_estimate: f64,
}
#[derive(Deserialize)]
struct Footprint {
    records: u64,
    payload_bytes: u64,
    idem_bytes_per_record: f64,
    baseline_bytes_per_record: f64,
}

/// Reads and parses `path`; `Ok(None)` if it does not exist, an error naming it otherwise.
fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| format!("cannot parse {}: {e}", path.display()))
}

/// The median ns per iteration of `group/function`, `Err(missing path)` inside if not run.
fn median(dir: &Path, group: &str, function: &str) -> Result<std::result::Result<f64, PathBuf>> {
    let path = dir.join(group).join(function).join("new").join("estimates.json");
    let Some(estimates) = read_json::<Estimates>(&path)? else {
        return Ok(Err(path));
    };
    let ns = estimates.median.point_estimate;
    if !(ns.is_finite() && ns > 0.0) {
        return Err(format!(
            "{}: median.point_estimate is {ns}, expected a positive number of nanoseconds",
            path.display()
        ));
    }
    Ok(Ok(ns))
}

/// Reads every comparison under the criterion directory `dir`, noting on stderr what did not run.
pub fn collect(dir: &Path) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for c in COMPARISONS {
        let values = match (median(dir, c.group, c.baseline)?, median(dir, c.group, c.idem)?) {
            (Ok(baseline), Ok(idem)) => Some((baseline, idem)),
            (Err(missing), _) | (_, Err(missing)) => {
                eprintln!("bench-report: {} not run ({} is missing)", c.group, missing.display());
                None
            }
        };
        rows.push(Row {
            label: c.label.to_string(),
            short: c.short,
            kind: c.kind,
            target: c.target,
            values,
        });
    }
    let path = dir.join("memory_footprint").join("result.json");
    let footprint = read_json::<Footprint>(&path)?;
    let (records, payload) =
        footprint.as_ref().map_or((1_000_000, 64), |f| (f.records, f.payload_bytes));
    let label = format!(
        "memory store bytes per record beside a {payload}-byte payload (the payload itself not counted), at {} records",
        thousands(records)
    );
    // The file holds what each side keeps per record in all; the target is what a record
    // costs beside its payload.
    let values = footprint.map(|f| {
        let beside = |total: f64| total - f.payload_bytes as f64;
        (beside(f.baseline_bytes_per_record), beside(f.idem_bytes_per_record))
    });
    match values {
        None => eprintln!("bench-report: memory_footprint not run ({} is missing)", path.display()),
        Some((b, i)) if !(b.is_finite() && i.is_finite() && b >= 0.0 && i >= 0.0) => {
            return Err(format!(
                "{}: bytes per record must be non-negative numbers",
                path.display()
            ));
        }
        Some(_) => {}
    }
    rows.push(Row {
        label,
        short: "memory bytes/record",
        kind: Kind::Bytes,
        target: FOOTPRINT_TARGET,
        values,
    });
    Ok(rows)
}

/// `1000000` as `1,000,000`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Nanoseconds as ns / µs / ms / s with three significant digits.
pub fn format_time(ns: f64) -> String {
    // Round first, so 999.7 ns becomes "1.00 µs" rather than "1000 ns".
    let rounded = if ns > 0.0 {
        let scale = 10f64.powi(2 - ns.log10().floor() as i32);
        (ns * scale).round() / scale
    } else {
        ns
    };
    let (value, unit) = match rounded {
        v if v < 1e3 => (v, "ns"),
        v if v < 1e6 => (v / 1e3, "µs"),
        v if v < 1e9 => (v / 1e6, "ms"),
        v => (v / 1e9, "s"),
    };
    let decimals = if value >= 100.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.decimals$} {unit}")
}

fn format_target(row: &Row) -> String {
    match row.kind {
        Kind::Cost => format!("<= {}x", row.target),
        Kind::Throughput => format!(">= {}x", row.target),
        Kind::Bytes => format!("<= {} bytes", row.target),
    }
}

/// The markdown table plus the notes under it.
pub fn markdown(rows: &[Row], date: &str, machine: &str) -> String {
    let mut out =
        String::from("| measure | baseline (median) | idem (median) | ratio | target | met? |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    for row in rows {
        let (baseline, idem, ratio) = match (row.values, row.kind) {
            (None, _) => ("not run".to_string(), "not run".to_string(), "—".to_string()),
            (Some((b, i)), Kind::Bytes) => {
                (format!("{b:.1} bytes"), format!("{i:.1} bytes"), "—".to_string())
            }
            (Some((b, i)), _) => {
                (format_time(b), format_time(i), format!("{:.2}x", row.ratio().unwrap_or(f64::NAN)))
            }
        };
        let met = match row.met() {
            None => "not run",
            Some(true) => "yes",
            Some(false) => "**no**",
        };
        out.push_str(&format!(
            "| {} | {baseline} | {idem} | {ratio} | {} | {met} |\n",
            row.label,
            format_target(row)
        ));
    }
    out.push_str(&format!(
        "\nMeasured {date} (UTC) on {machine}; criterion medians of one run each. Cost rows: ratio = idem time / \
         baseline time, lower is better. Throughput rows: ratio = baseline time / idem time (idem calls/s relative \
         to the baseline), higher is better.\n"
    ));
    out
}

/// `days` since 1970-01-01 as a (year, month, day) civil date.
pub fn civil_date(days: i64) -> (i64, u32, u32) {
    // Shift to an era calendar starting on 0000-03-01, so leap days fall at the end of a year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153; // 0 = March
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 { shifted_month + 3 } else { shifted_month - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (y, m, d) = civil_date(secs.div_euclid(86_400));
    format!("{y:04}-{m:02}-{d:02}")
}

fn machine() -> String {
    let threads = std::thread::available_parallelism().map(|n| n.get().to_string());
    format!(
        "{}, {} CPUs available to the process",
        std::env::consts::ARCH,
        threads.unwrap_or_else(|_| "?".into())
    )
}

/// Replaces the lines between the report markers in `text` with `block`; `name` is for errors.
pub fn replace_between(text: &str, block: &str, name: &str) -> Result<String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let find = |marker: &str| {
        let mut hits = lines.iter().enumerate().filter(|(_, l)| l.trim() == marker).map(|(i, _)| i);
        match (hits.next(), hits.next()) {
            (Some(i), None) => Ok(i),
            (None, _) => Err(format!(
                "{name}: no line `{marker}`; add the start and end markers where the table goes"
            )),
            (Some(_), Some(_)) => {
                Err(format!("{name}: the line `{marker}` appears more than once"))
            }
        }
    };
    let (start, end) = (find(START_MARKER)?, find(END_MARKER)?);
    if end < start {
        return Err(format!("{name}: `{END_MARKER}` comes before `{START_MARKER}`"));
    }
    let mut out: String = lines[..=start].concat();
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(block);
    if !block.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&lines[end..].concat());
    Ok(out)
}

struct Args {
    criterion: PathBuf,
    markdown: Option<PathBuf>,
    svg: Option<PathBuf>,
}

/// Parses the command line; `Ok(None)` when help was asked for.
fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Option<Args>> {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    let mut parsed = Args { criterion: target.join("criterion"), markdown: None, svg: None };
    while let Some(arg) = args.next() {
        let slot = match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--criterion" => &mut parsed.criterion,
            "--markdown" => parsed.markdown.insert(PathBuf::new()),
            "--svg" => parsed.svg.insert(PathBuf::new()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        };
        *slot = args
            .next()
            .map(PathBuf::from)
            .ok_or_else(|| format!("`{arg}` needs a path\n{USAGE}"))?;
    }
    Ok(Some(parsed))
}

fn run() -> Result<()> {
    let Some(args) = parse_args(std::env::args().skip(1))? else {
        println!("{USAGE}");
        return Ok(());
    };
    if !args.criterion.is_dir() {
        return Err(format!("criterion directory {} does not exist; run `cargo bench` first or pass --criterion DIR", args.criterion.display()));
    }
    let rows = collect(&args.criterion)?;
    let block = markdown(&rows, &today(), &machine());
    print!("{block}");
    if let Some(path) = &args.markdown {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {name}: {e}"))?;
        let updated = replace_between(&text, &block, &name)?;
        std::fs::write(path, updated).map_err(|e| format!("cannot write {name}: {e}"))?;
    }
    if let Some(path) = &args.svg {
        chart::write_svg(path, &rows)?;
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench-report: {e}");
        std::process::exit(1);
    }
}
