use super::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixture").join(name)
}

fn row<'a>(rows: &'a [Row], label_start: &str) -> &'a Row {
    rows.iter()
        .find(|r| r.label.starts_with(label_start))
        .unwrap_or_else(|| panic!("no row starting with {label_start}"))
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

#[test]
fn fixture_ratios_and_verdicts() {
    let rows = collect(&fixture("criterion")).expect("fixture parses");
    assert_eq!(rows.len(), COMPARISONS.len() + 1);
    let cost = row(&rows, "memory replay with `fingerprint = none`");
    assert!(close(cost.ratio(), 1.2), "{:?}", cost.ratio());
    assert_eq!(cost.met(), Some(true));
    let first = row(&rows, "memory first call");
    assert!(close(first.ratio(), 2.0));
    assert_eq!(first.met(), Some(true), "2.0x is at the 2x ceiling");
    let redis = row(&rows, "Redis replay vs raw GET + decode, 1 caller");
    assert!(close(redis.ratio(), 0.8)); // baseline / idem: 50 µs / 62.5 µs
    assert_eq!(redis.met(), Some(false));
    let pg = row(&rows, "Postgres first call");
    assert!(close(pg.ratio(), 0.5));
    assert_eq!(pg.met(), Some(true));
    let scaling = row(&rows, "memory store calls/s");
    assert!(close(scaling.ratio(), 100.0 / 55.0));
    assert_eq!(scaling.met(), Some(true));
    let footprint = row(&rows, "memory store bytes per record");
    // In all 90.25 and 150.5 bytes; beside the 64-byte payload:
    assert_eq!(footprint.values, Some((26.25, 86.5)));
    assert_eq!(footprint.met(), Some(true));
    assert_eq!(footprint.ratio(), None);
    // Only the idem half of this group exists: not run, not an error.
    let half = row(&rows, "memory replay via the macro with the local cache");
    assert_eq!((half.values, half.met()), (None, None));
    assert_eq!(row(&rows, "Redis replay vs raw GET + decode, 32").values, None);
    let checked = row(&rows, "memory replay via the macro vs a hand-written check");
    assert_eq!((checked.values, checked.met()), (None, None));
}

#[test]
fn targets_are_inclusive_and_directional() {
    let mut r = Row {
        label: String::new(),
        short: "",
        kind: Kind::Cost,
        target: 1.5,
        values: Some((2.0, 3.0)),
    };
    assert_eq!(r.met(), Some(true)); // 1.5x cost, at the ceiling
    r.values = Some((2.0, 3.2));
    assert_eq!(r.met(), Some(false));
    r.kind = Kind::Throughput;
    r.target = 0.5;
    r.values = Some((1.0, 2.0));
    assert_eq!(r.met(), Some(true)); // 0.5x throughput, at the floor
    r.values = Some((1.0, 2.5));
    assert_eq!(r.met(), Some(false));
    r.kind = Kind::Bytes;
    r.target = 200.0;
    r.values = Some((10.0, 200.5));
    assert_eq!(r.met(), Some(false));
}

#[test]
fn table_shows_values_and_not_run() {
    let rows = collect(&fixture("criterion")).expect("fixture parses");
    let table = markdown(&rows, "2026-01-02", "x86_64, 2 hardware threads available");
    assert!(table
        .starts_with("| measure | baseline (median) | idem (median) | ratio | target | met? |\n"));
    let line =
        |start: &str| table.lines().find(|l| l.starts_with(start)).unwrap_or_default().to_string();
    assert_eq!(
        line("| memory first call"),
        "| memory first call via the macro vs hand-written insert + encode | 1.00 µs | 2.00 µs | 2.00x | <= 2x | yes |"
    );
    assert_eq!(
        line("| Redis replay vs raw GET + decode, 1 caller"),
        "| Redis replay vs raw GET + decode, 1 caller | 50.0 µs | 62.5 µs | 0.80x | >= 0.9x | **no** |"
    );
    assert!(line("| memory replay via the macro with")
        .ends_with("| not run | not run | — | <= 1.5x | not run |"));
    assert!(line("| memory store bytes")
        .ends_with("| 26.2 bytes | 86.5 bytes | — | <= 200 bytes | yes |"));
    assert!(table.contains("Measured 2026-01-02 (UTC) on x86_64, 2 hardware threads available"));
}

#[test]
fn unparsable_file_is_an_error_naming_it() {
    let err = collect(&fixture("broken")).expect_err("broken fixture must fail");
    assert!(err.contains("memory_replay/idem_fingerprint_none/new/estimates.json"), "{err}");
    assert!(err.starts_with("cannot parse "), "{err}");
}

#[test]
fn times_have_three_significant_digits() {
    assert_eq!(format_time(123.4), "123 ns");
    assert_eq!(format_time(5.678), "5.68 ns");
    assert_eq!(format_time(999.7), "1.00 µs");
    assert_eq!(format_time(12_345.0), "12.3 µs");
    assert_eq!(format_time(45_600_000.0), "45.6 ms");
    assert_eq!(format_time(2.5e9), "2.50 s");
}

#[test]
fn civil_dates() {
    assert_eq!(civil_date(0), (1970, 1, 1));
    assert_eq!(civil_date(-1), (1969, 12, 31));
    assert_eq!(civil_date(11_016), (2000, 2, 29));
    assert_eq!(civil_date(11_017), (2000, 3, 1));
    assert_eq!(civil_date(19_723), (2024, 1, 1));
    assert_eq!(civil_date(20_786), (2026, 11, 29));
}

#[test]
fn markdown_replacement_keeps_markers_and_surroundings() {
    let text = "# Benchmarks\n\n<!-- bench-report:start -->\nold table\nold note\n<!-- bench-report:end -->\n\nafter\n";
    let out = replace_between(text, "| new |\n", "B.md").expect("markers present");
    assert_eq!(out, "# Benchmarks\n\n<!-- bench-report:start -->\n| new |\n<!-- bench-report:end -->\n\nafter\n");
    // Idempotent: running again over its own output changes nothing.
    assert_eq!(replace_between(&out, "| new |\n", "B.md").as_deref(), Ok(out.as_str()));
}

#[test]
fn markdown_replacement_errors_name_the_file() {
    let err = replace_between("# no markers\n", "x\n", "docs/B.md").expect_err("no markers");
    assert!(err.starts_with("docs/B.md: ") && err.contains(START_MARKER), "{err}");
    let err = replace_between("<!-- bench-report:start -->\n", "x\n", "B.md").expect_err("no end");
    assert!(err.contains(END_MARKER), "{err}");
    let swapped = "<!-- bench-report:end -->\n<!-- bench-report:start -->\n";
    assert!(replace_between(swapped, "x\n", "B.md").is_err());
}

#[test]
fn svg_chart_is_written() {
    let rows = collect(&fixture("criterion")).expect("fixture parses");
    let path = std::env::temp_dir().join(format!("bench-report-test-{}.svg", std::process::id()));
    chart::write_svg(&path, &rows).expect("chart draws");
    let svg = std::fs::read_to_string(&path).expect("svg written");
    let _ = std::fs::remove_file(&path);
    assert!(svg.contains("idem vs the hand-written baseline (ratio, one run)"));
    assert!(svg.contains("Postgres first call") && svg.contains("0.50x (target ≥ 0.5x)"));
    assert!(svg.contains("Not run: "), "the rows not run are named or counted");
    assert!(!svg.contains("memory bytes/record</text>"), "footprint is table-only");
}
