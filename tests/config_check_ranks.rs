//! `probe config-check` on folders of per-rank packs (issue 52, item 1), run as the real
//! binary on packs made from testdata/config_check/base.zip (a real run's pack) with each
//! rank's manifest and variables set. Real torchrun jobs: python/tests/test_config_check_ranks.py.

use serde_json::Value;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;

fn base() -> Vec<(String, Value)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/config_check/base.zip");
    let mut z = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    (0..z.len())
        .map(|i| {
            let mut f = z.by_index(i).unwrap();
            let mut s = String::new();
            f.read_to_string(&mut s).unwrap();
            (
                f.name().unwrap().to_string(),
                serde_json::from_str(&s).unwrap(),
            )
        })
        .collect()
}

/// Writes rank `rank`'s pack of a job of `world` ranks, as the agent would, then `tweak`.
fn write_pack(
    path: &Path,
    rank: u64,
    world: u64,
    job: &str,
    tweak: impl Fn(&mut [(String, Value)]),
) {
    let mut docs = base();
    for (name, v) in docs.iter_mut() {
        match name.as_str() {
            "manifest.json" => {
                v["rank"] = rank.into();
                v["world_size"] = world.into();
            }
            "env.json" => {
                let vars = &mut v["vars"];
                vars["RANK"] = rank.to_string().into();
                vars["LOCAL_RANK"] = rank.to_string().into();
                vars["WORLD_SIZE"] = world.to_string().into();
                vars["TORCHELASTIC_RUN_ID"] = job.into();
            }
            "dataset.json" | "weights.json" => {
                for r in v["records"].as_array_mut().unwrap() {
                    r["rank"] = rank.into();
                }
            }
            _ => {}
        }
    }
    tweak(&mut docs);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    for (name, v) in &docs {
        let o = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        z.start_file(name.as_str(), o).unwrap();
        z.write_all(v.to_string().as_bytes()).unwrap();
    }
    z.finish().unwrap();
}

fn entry<'a>(docs: &'a mut [(String, Value)], name: &str) -> &'a mut Value {
    &mut docs.iter_mut().find(|(n, _)| n == name).unwrap().1
}

/// A change made to one pack's documents.
type Tweak<'a> = &'a dyn Fn(&mut [(String, Value)]);

/// A job of `world` ranks in `dir`; `odd` changes one rank.
fn job(dir: &Path, world: u64, id: &str, odd: Option<(u64, Tweak)>) {
    for r in 0..world {
        let p = dir.join(format!("rank{r}.zip"));
        match odd {
            Some((k, f)) if k == r => write_pack(&p, r, world, id, f),
            _ => write_pack(&p, r, world, id, |_| {}),
        }
    }
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    json: Option<Value>,
}

fn check(bench: &Path, cmp: &Path) -> Run {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = Command::new(env!("CARGO_BIN_EXE_probe"))
        .arg("config-check")
        .arg(bench)
        .arg(cmp)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    let json = std::fs::read_to_string(out.join("config_check.json"))
        .ok()
        .map(|t| serde_json::from_str(&t).unwrap());
    Run {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        json,
    }
}

fn headline(j: &Value) -> Vec<String> {
    j["ranks"]["headline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn clean_jobs_pass_and_the_odd_rank_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    job(&a, 8, "job-a", None);
    job(&b, 8, "job-b", None);
    let r = check(&a, &b);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let j = r.json.unwrap();
    assert_eq!(j["ranks"]["compared"], "0-7");
    assert!(j["ranks"]["consistency"].as_array().unwrap().is_empty());
    assert!(
        headline(&j)[0].contains("no difference"),
        "{:?}",
        headline(&j)
    );
    // Identical items on every rank are listed once, with their ranks.
    let numpy: Vec<&Value> = j["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["item"] == "numpy")
        .collect();
    assert_eq!(numpy.len(), 1);
    assert_eq!(
        numpy[0]["ranks"],
        serde_json::json!([0, 1, 2, 3, 4, 5, 6, 7])
    );

    let c = tmp.path().join("c");
    let odd = |d: &mut [(String, Value)]| {
        entry(d, "env.json")["vars"]["NCCL_ALGO"] = "Ring".into();
        entry(d, "packages.json")["distributions"]["numpy"] = "9.9.9".into();
    };
    job(&c, 8, "job-c", Some((5, &odd)));
    let r = check(&a, &c);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let j = r.json.unwrap();
    let h = headline(&j);
    assert!(
        h[0].starts_with("rank 5 of cmp differs from the other 7 ranks: env NCCL_ALGO = Ring"),
        "{h:?}"
    );
    assert!(
        h[0].contains("packages numpy = 9.9.9 (others: 2.4.6)"),
        "{h:?}"
    );
    assert!(h[1].starts_with("rank 5, bench vs cmp:"), "{h:?}");
    assert!(r.stdout.contains("rank 5 of cmp differs"), "{}", r.stdout);
    let f = &j["ranks"]["consistency"].as_array().unwrap()[0];
    assert_eq!(
        (f["side"].as_str(), f["ranks"].clone()),
        (Some("cmp"), serde_json::json!([5]))
    );
    let row5 = &j["ranks"]["matrix"][5];
    assert_eq!(row5["cells"]["env"], "error");
    assert_eq!(row5["cells"]["weights"], "pass");
    assert_eq!(j["ranks"]["matrix"][4]["cells"]["env"], "pass");
}

#[test]
fn rank_dependent_items_and_varying_seeds_are_not_flagged() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    for r in 0..4u64 {
        write_pack(&a.join(format!("r{r}.zip")), r, 4, "j", move |d| {
            entry(d, "env.json")["vars"]["CUDA_VISIBLE_DEVICES"] = r.to_string().into();
            // seed + rank: a seed per rank by design.
            for s in entry(d, "random.json")["seed_calls"]
                .as_array_mut()
                .unwrap()
            {
                if s["function"] == "torch.manual_seed" {
                    s["value"] = (100 + r).into();
                }
            }
        });
    }
    let r = check(&a, &a);
    let j = r.json.unwrap();
    assert!(
        j["ranks"]["consistency"].as_array().unwrap().is_empty(),
        "{}",
        j["ranks"]
    );
    let notes = j["categories"][3]["notes"].to_string();
    assert!(notes.contains("vary by rank"), "{notes}");
}

#[test]
fn a_glob_and_a_single_pack_are_sides_too() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    job(&a, 4, "j", None);
    let r = check(&a.join("rank*.zip"), &a.join("rank2.zip"));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let j = r.json.unwrap();
    assert_eq!(j["ranks"]["compared"], "2");
    assert!(
        headline(&j)[0].contains("ranks 2 compared"),
        "{:?}",
        headline(&j)
    );
}

#[test]
fn missing_ranks_are_said_and_exit_4() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    job(&a, 4, "a", None);
    job(&b, 4, "b", None);
    std::fs::remove_file(b.join("rank2.zip")).unwrap();
    let r = check(&a, &b);
    assert_eq!(r.code, 4, "{}{}", r.stdout, r.stderr);
    let j = r.json.unwrap();
    assert_eq!(j["ranks"]["cmp"]["missing"], serde_json::json!([2]));
    assert!(
        headline(&j)[0].starts_with("cmp: rank 2 missing"),
        "{:?}",
        headline(&j)
    );
    assert_eq!(j["ranks"]["matrix"][2]["cmp"], false);
}

#[test]
fn other_world_sizes_compare_what_they_share() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    job(&a, 4, "a", None);
    job(&b, 2, "b", None);
    let r = check(&a, &b);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let j = r.json.unwrap();
    assert_eq!(j["ranks"]["compared"], "0-1");
    let h = headline(&j);
    assert!(
        h[0].contains("bench has ranks 0-3 (4 packs), cmp has ranks 0-1 (2 packs)"),
        "{h:?}"
    );
    assert!(
        h.iter().any(|l| l.contains("env WORLD_SIZE 4 vs 2")),
        "{h:?}"
    );
}

fn expect_error(bench: &Path, cmp: &Path, code: i32, needles: &[&str]) {
    let r = check(bench, cmp);
    assert_eq!(r.code, code, "{}{}", r.stdout, r.stderr);
    assert!(r.json.is_none(), "no report on bad input");
    for n in needles {
        assert!(r.stderr.contains(n), "{n:?} not in {}", r.stderr);
    }
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
}

#[test]
fn packs_of_two_jobs_in_one_folder_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    job(&a, 4, "a", None);
    write_pack(&a.join("other.zip"), 0, 2, "b", |_| {});
    expect_error(
        &a,
        &a,
        2,
        &["packs of different jobs", "world size 2 in", "other.zip"],
    );
    std::fs::remove_file(a.join("other.zip")).unwrap();
    write_pack(&a.join("rank3.zip"), 3, 4, "another-run", |_| {});
    expect_error(
        &a,
        &a,
        2,
        &["TORCHELASTIC_RUN_ID another-run in", "rank3.zip"],
    );
}

#[test]
fn a_rank_twice_or_out_of_range_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    job(&a, 2, "a", None);
    write_pack(&a.join("copy.zip"), 1, 2, "a", |_| {});
    expect_error(&a, &a, 2, &["two packs of rank 1", "copy.zip", "rank1.zip"]);
    std::fs::remove_file(a.join("copy.zip")).unwrap();
    write_pack(&a.join("rank9.zip"), 9, 2, "a", |_| {});
    expect_error(&a, &a, 2, &["rank 9 in a job of world size 2"]);
}

#[test]
fn empty_folders_unreadable_packs_and_disjoint_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, empty) = (tmp.path().join("a"), tmp.path().join("empty"));
    job(&a, 2, "a", None);
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("notes.txt"), "hi").unwrap();
    expect_error(&a, &empty, 2, &["no config pack (*.zip) in this folder"]);
    expect_error(&a, &tmp.path().join("nothing*.zip"), 2, &["no such file"]);
    std::fs::write(a.join("rank1.zip"), b"not a zip").unwrap();
    expect_error(&a, &a, 2, &["rank1.zip"]);
    let (x, y) = (tmp.path().join("x"), tmp.path().join("y"));
    job(&x, 2, "x", None);
    write_pack(&y.join("r3.zip"), 3, 4, "y", |_| {});
    expect_error(&x, &y, 3, &["no rank in both"]);
}

#[test]
fn a_section_missing_on_one_rank_is_a_finding() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let drop_det = |d: &mut [(String, Value)]| {
        let det = entry(d, "determinism.json");
        *det = serde_json::json!({"flags": {}});
    };
    job(&a, 3, "a", Some((1, &drop_det)));
    let r = check(&a, &a);
    let j = r.json.unwrap();
    let f: Vec<&Value> = j["ranks"]["consistency"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["side"] == "bench" && f["category"] == "determinism")
        .collect();
    assert!(!f.is_empty(), "{}", j["ranks"]);
    assert!(f.iter().all(|f| f["ranks"] == serde_json::json!([1])));
}

/// A glob under a folder whose name holds glob characters (`[`): the folder is taken
/// literally, the pattern is only the part below it.
#[test]
fn a_glob_under_a_folder_named_with_brackets() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("run[1"), tmp.path().join("exp[2]"));
    job(&a, 2, "job-a", None);
    job(&b, 2, "job-b", None);
    std::fs::create_dir_all(tmp.path().join("exp2")).unwrap(); // what `[2]` would match
    let r = check(&a.join("rank*.zip"), &b.join("rank*.zip"));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(r.json.unwrap()["ranks"]["compared"], "0-1");
}
