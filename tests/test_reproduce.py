"""`reproflow reproduce`, the claims, the report page (checked in headless Chromium) and `reproflow archive`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
from conftest import ROOT, chromium_tab, one_case_claim, reproflow

from reproflow.app.reproduce.estimate import Estimate
from reproflow.app.reproduce.plan import PLAN, Folders, Plan, Step, Target, load_plan
from reproflow.app.reproduce.progress import Progress
from reproflow.app.reproduce.resample import plan_resamples
from reproflow.reporting.claims import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_APPLICABLE,
    NOT_COMPARED,
    NOT_MEASURED,
    ONCE,
    Claim,
)
from reproflow.reporting.report import family_part
from reproflow.reporting.summary import SCHEMA
from reproflow.spec.errors import ReproflowError
from reproflow.spec.family import families

# Screenshots of the page the browser test took, kept after the run for people to look at.
ARTIFACTS = ROOT / "test-artifacts"


def test_every_family_has_a_target_and_every_target_a_make_target() -> None:
    plan = load_plan(ROOT / PLAN)
    assert {t.family for t in plan.targets.values()} == set(families())
    assert {s for t in plan.targets.values() for s in t.steps} == set(plan.steps)
    makefile = (ROOT / "Makefile").read_text()
    figures = re.search(r"^FIGURES := (.*?)\n\n", makefile, re.M | re.S)
    assert figures is not None
    assert figures[1].replace("\\\n", " ").split() == list(plan.targets)
    # make fig8 measures the search only; make reproduce runs Aceso once.
    assert [s.name for s in plan.select(["fig8"])[1]] == ["aceso-search"]
    assert "aceso-search" not in [s.name for s in plan.select([])[1]]
    # The large-scale search steps run only when named, and only with the artifact's data.
    assert "aceso-large" not in {t.name for t in plan.select([])[0]}
    assert [s.name for s in plan.select(["aceso-large"])[1]] == ["aceso-large", "aceso-scale"]
    proc = reproflow("reproduce", "--only", "aceso-large", "--results", "r", "--logs", "l", "--reports", "p")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "give --reference (make REFERENCE=...)" in proc.stderr and "profiled-time-eurosys" in proc.stderr


def test_plan_errors_name_the_entry_and_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "plan.toml"
    bad.write_text('[[step]]\nname = "a"\ncommand = "run x"\nminutes = 1\nnodes = 2\n')
    with pytest.raises(ReproflowError, match=r"step 1 \(a\).*nodes.*fields are name, command"):
        load_plan(bad)
    bad.write_text('[[target]]\nname = "t"\nfamily = "cfp"\ntitle = "x"\nsteps = ["nope"]\n')
    with pytest.raises(ReproflowError, match="target t: steps nope are not defined"):
        load_plan(bad)
    proc = reproflow("reproduce", "--plan", str(bad), "--estimate")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "nope" in proc.stderr
    proc = reproflow("reproduce", "--only", "fig99", "--estimate")
    assert proc.returncode == 2 and "no such target" in proc.stderr and "fig7" in proc.stderr


def test_aceso_claims_judge_the_rounds_in_the_rows() -> None:
    """Each comparison over the rounds in turns, paired by round number, from the rows alone: the paper's
    (each side's predicted pick) and the strongest (each side's measured pick); one config standing for
    two picks trains once; the prediction judged for Aceso's configs only."""
    claims = family_part("aceso", "claims").claims
    empty = claims(pd.DataFrame(), Path("."))
    assert [c.status for c in empty] == [NOT_MEASURED] * 3 and all("make fig" in c.detail for c in empty)

    def rounds(plan: str, pick: str, name: str, by_round: dict[int, list[float]], predicted: float | None = None,
               case: str = "", digest: str = "") -> pd.DataFrame:
        base = {"suite": "aceso-train-gpt-tiny", "experiment": "trainings", "world_size": 2, "backend": "gloo",
                "device": "cpu", "timestamp": "2026-11-24T00:00:00", "plan": plan, "pick": pick, "model_name": "gpt",
                "model_size": "tiny", "case": case, "tp_impl": "reproflow", "config_name": name,
                "config_digest": digest or name}
        steps = [pd.DataFrame({**base, "point": f"{name}-{r}", "round": r, "metric": "step_ms", "value": ms,
                               "iteration": range(3, 3 + len(ms))}) for r, ms in by_round.items()]
        extra = [pd.DataFrame([{**base, "point": f"{name}-{r}", "round": r, "metric": "predicted_ms",
                                "value": predicted} for r in by_round])] if predicted else []
        return pd.concat([*steps, *extra])

    aceso = rounds("aceso", "both", "a", {1: [66.0, 66.0], 2: [80.0, 80.0]}, predicted=95.0)
    best = rounds("megatron", "measured", "m", {1: [99.0, 99.0], 2: [100.0, 100.0]}, predicted=200.0)
    uniform = rounds("megatron", "predicted", "u", {1: [90.0, 90.0], 2: [96.0, 96.0]})
    paper, strongest, error = claims(pd.concat([aceso, best, uniform]), Path("."))
    assert strongest.measured == pytest.approx((1.5 * 1.25) ** 0.5)
    assert strongest.interval[0] < 1.0 < 1.5 < strongest.interval[1] and strongest.status == INCONCLUSIVE
    assert paper.measured == pytest.approx((90 / 66 * 96 / 80) ** 0.5) and paper.cases[0].label == "gpt tiny"
    # The prediction before any training (95 ms) over the rounds' medians (66 and 80): wide, no verdict; the
    # Megatron-LM plan's prediction shown beside it, not judged.
    assert error.status == INCONCLUSIVE and error.measured == pytest.approx(95 / (66 * 80) ** 0.5)
    assert [c.label for c in error.cases] == ["gpt tiny a"] and "gpt tiny m 2.010" in error.detail
    # A round missing on one side is left out and said, never paired by position.
    more = pd.concat([aceso, best, uniform, rounds("megatron", "measured", "m", {3: [300.0, 300.0]})])
    strongest = claims(more, Path("."))[1]
    assert strongest.measured == pytest.approx((1.5 * 1.25) ** 0.5)
    assert "round(s) 3 measured on one side only" in strongest.cases[0].note
    # The same plan under two names (Aceso's search returned the grid's plan): not compared.
    itself = rounds("megatron", "measured", "m", {1: [66.0], 2: [80.0]}, digest="a")
    assert claims(pd.concat([aceso, itself, uniform]), Path("."))[1].status == NOT_COMPARED
    # A case of its own (GPT under memory pressure) is judged as its own case; its baseline not trained:
    # not measured, never dropped.
    memory = rounds("aceso", "both", "a2", {1: [50.0], 2: [50.0]}, case="memory")
    strongest = claims(pd.concat([aceso, best, uniform, memory]), Path("."))[1]
    assert [(c.label, c.status) for c in strongest.cases] == [("gpt tiny", INCONCLUSIVE),
                                                              ("gpt tiny-memory", NOT_MEASURED)]
    # Ranks that shared fewer cores: not applicable, however the step was started.
    shared = pd.concat([aceso, best, uniform]).assign(nodelist="vm", host_cpus=1)
    assert {c.status for c in claims(shared, Path("."))} == {NOT_APPLICABLE}
    # On one rank Aceso's space is the grid's plus per-op recomputation: the speed claims test nothing there;
    # the prediction still applies.
    alone = claims(pd.concat([aceso, best, uniform]).assign(world_size=1), Path("."))
    assert [c.status for c in alone] == [NOT_APPLICABLE, NOT_APPLICABLE, INCONCLUSIVE]
    assert "one rank: Aceso's space then adds only per-op recomputation" in alone[0].record()["where"]


def test_without_rows_every_claim_is_not_measured_and_says_what_to_run(tmp_path: Path) -> None:
    targets = load_plan(ROOT / PLAN).targets
    for name in families():
        module = family_part(name, "claims")
        for claim in getattr(module, "claims", lambda *_: [])(pd.DataFrame(), tmp_path):
            assert claim.status == NOT_MEASURED and claim.family == name and claim.paper
            assert claim.target in targets and f"make {claim.target}" in claim.detail


def test_time_left_follows_the_plan_until_the_step_has_its_own_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("reproflow.app.reproduce.progress.time.monotonic", lambda: now[0])
    plan = [Estimate(Step("first", "run a", 2.0, 4), 1, 4, 0, 2.0, "plan"),
            Estimate(Step("cfp", "cfp all", 1.5, 12), 1, 12, None, 1.5, "plan")]
    progress = Progress(plan, out=lambda _: None, tty=False)
    progress.begin(0)
    assert progress.left() == pytest.approx(3.5 * 60)  # nothing measured: the plan's figures
    now[0] += 60
    progress.point("a", finished=True)
    progress.point("b", finished=True)  # half the step in half its planned time: on plan
    assert progress.left() == pytest.approx(2.5 * 60)
    progress.begin(1)
    assert progress.left() == pytest.approx(90)
    now[0] += 60
    progress.point("analysis", finished=True)  # a slow first point: 12 such points would take 12 minutes
    left = progress.left()
    assert 90 < left < 3 * 60, left  # moved towards the pace, not jumped to it
    for _ in range(10):
        now[0] += 60
        progress.point("x", finished=True)
    assert progress.left() == pytest.approx((1 / 12) * (1.5 * 60 / 12) + (11 / 12) * 60, rel=1e-6)


def test_on_a_terminal_the_progress_is_one_bar_with_messages_above_it(capsys: pytest.CaptureFixture[str]) -> None:
    plan = [Estimate(Step("a", "run a", 1.0, 2), 1, 2, 0, 1.0, "plan"),
            Estimate(Step("b", "run b", 1.0, 1), 1, 1, 0, 1.0, "plan")]
    progress = Progress(plan, tty=True)
    for index, points in enumerate((2, 1)):
        progress.begin(index)
        progress.say(f"-- step {index + 1}/2")
        for k in range(points):
            progress.point(f"point {k}", finished=True)
    progress.close()
    progress.say("summary")
    screen = capsys.readouterr().out
    lines = [part.strip() for part in re.split(r"[\r\n]", screen) if part.strip()]
    assert "-- step 1/2" in lines and "-- step 2/2" in lines and lines[-1] == "summary"
    assert re.search(r"^\[0:00:0\d elapsed, ~0:00:00 left\] \S+ 3/3 points, step 2/2 b: point 0$", lines[-2]), lines


def test_inconclusive_claims_get_more_samples_within_the_plans_budget() -> None:
    more = Step("timing", "run s", 2.0, more="--set steps={samples}", samples=10, max_samples=60,
                more_minutes=1.0, sample_minutes=0.05)
    plain = Step("other", "run o", 1.0)
    plan = Plan({"timing": more, "other": plain}, {"t": Target("t", "f", "", ("timing",)),
                                                   "o": Target("o", "f", "", ("other",))}, more_minutes=4.0)

    def inconclusive(low: float, high: float, measured: float = 1.03, target: str = "t") -> Claim:
        return one_case_claim(measured, (low, high), statement=f"claim {low}", target=target)

    near = inconclusive(0.97, 1.10)  # (half-width / distance)^2 = 4.5: 10 x 4.5 x 1.2 = 55 steps, 3.75 min
    chosen, notes = plan_resamples(plan, list(plan.targets.values()), [near])
    assert [(r.step.name, r.samples) for r in chosen] == [("timing", 55)] and notes == []
    assert chosen[0].minutes == pytest.approx(1.0 + 0.05 * 55)
    # Past the most samples a run may take, on the threshold, no step to rerun, or beyond the budget: said why.
    _, notes = plan_resamples(plan, list(plan.targets.values()), [inconclusive(0.99, 1.08, 1.01)])
    assert "more than the plan allows (timing: at most 60)" in notes[0]
    _, notes = plan_resamples(plan, list(plan.targets.values()), [inconclusive(0.9, 1.1, 1.0)])
    assert "on its threshold" in notes[0]
    _, notes = plan_resamples(plan, list(plan.targets.values()), [inconclusive(0.97, 1.10, target="o")])
    assert "no step of target o measures more samples" in notes[0]
    chosen, notes = plan_resamples(plan, list(plan.targets.values()), [near, inconclusive(0.97, 1.14, 1.05)])
    assert len(chosen) == 1 and "beyond what is left of the plan's 4 min" in notes[0]
    # Claims that hold, and targets not selected, get nothing.
    held = one_case_claim(1.2, (1.1, 1.3), target="t")
    assert plan_resamples(plan, [plan.targets["o"]], [near, held]) == ([], [])


def test_estimate_and_dry_run_submit_nothing(tmp_path: Path) -> None:
    proc = reproflow("reproduce", "--estimate", "--results", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    for name in load_plan(ROOT / PLAN).targets:
        assert f"{name}: " in proc.stdout
    assert re.search(r"^total\s+\d+\s+[\d.]+\s+[\d.]+$", proc.stdout, re.M), proc.stdout
    proc = reproflow("reproduce", "--dry-run", "--executor", "slurm", "--only", "comms,fig7", "--image", "/a.sqsh",
                     "--partition", "p5")
    assert proc.returncode == 0, proc.stderr
    assert "node-hours" in proc.stdout
    # In the image, the steps' folders are mounted where they are here; every job option reaches every step.
    folders = ",".join(f"{ROOT / f}:{ROOT / f}" for f in ("results", "logs", "reports"))
    assert (f"reproflow submit param-demo -e comms --results results --partition p5 --image /a.sqsh --mounts {folders} "
            "--retries 2") in proc.stdout
    assert "reproflow aceso reproduce small --no-megatron-core --log-path logs/aceso" in proc.stdout
    assert f"--submit --partition p5 --image /a.sqsh --mounts {folders}" in proc.stdout
    assert not (tmp_path / "r").exists()


def test_the_four_rank_plan_needs_a_core_a_rank_and_its_commands_parse(tmp_path: Path) -> None:
    """workflows/reproduce/four-ranks.toml (a GPU node's CPUs run it, benchmarks/gpu_node_aceso_cores.sh):
    its steps take 4 cores, name targets of the claims' families, and each command is one the families'
    command lines take, on 4 ranks (--dry-run: the suites written, nothing run)."""
    plan = load_plan(ROOT / "workflows" / "reproduce" / "four-ranks.toml")
    assert {t.family for t in plan.targets.values()} == {"aceso", "cfp"}
    assert all(s.min_cpus == 4 for s in plan.steps.values())
    folders = Folders(tmp_path / "r", tmp_path / "p", tmp_path / "l")
    for step in plan.steps.values():
        proc = reproflow(*folders.argv(step.command, step.reference), "--dry-run")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (step.name, proc.stderr[-2000:])
        assert "# " in proc.stdout and "4 local rank(s)" in proc.stdout, (step.name, proc.stdout[-2000:])
    assert not list((tmp_path / "r").rglob("*.csv"))


def tiny_plan(tmp_path: Path) -> Path:
    """Every family at the smallest size that still measures something: about a minute on 2 cores."""
    suites = {
        "comms": ('[launch]\nnodes = 1\nprocs_per_node = 2\nbackend = "gloo"\ndevice = "cpu"\n[[experiment]]\n'
                  'name = "comms"\nfamily = "param_comms"\nparams = { begin_size = "1K", end_size = "16K", '
                  'step_factor = 4, warmup_iters = 1, iters = 2 }\nmatrix = { collective = ["all_reduce", '
                  '"all_gather"] }\n'),
        "resharding": ('[launch]\nnodes = 2\nprocs_per_node = 2\nbackend = "gloo"\ndevice = "cpu"\n[[experiment]]\n'
                       'name = "1-to-m"\nfamily = "resharding"\nparams = { scale = 128, runs = 2, warmup_runs = 1, '
                       'case = "1-to-1x2" }\nzip = { resharding_mode = ["send_recv", "ring_broadcast"] }\n'),
        "spatial": ('[launch]\nnodes = 1\nlauncher = "mpi"\n[[experiment]]\nname = "check"\nfamily = "spatial"\n'
                    'launch = { procs_per_node = 5 }\nparams = { model = "resnet", resnet_depth = 29, image_size = 64, '
                    'batch_size = 2, split_size = 2, spatial_size = 1, num_spatial_parts = 4, fused_layers = 2, '
                    'steps = 1, slice_method = "square" }\nmatrix = { halo_d2 = [false, true] }\n'),
    }
    text = ""
    for name, body in suites.items():
        path = tmp_path / f"tiny-{name}.toml"
        path.write_text(f'[suite]\ndescription = "tiny {name}"\n' + body)
        text += f'[[step]]\nname = "{name}"\ncommand = "run {path} --results {{results}}"\nminutes = 0.3\n'
    # A step whose claim takes a core per rank, on more cores than any machine has: left out, said so.
    text += ('[[step]]\nname = "spatial-timed"\ncommand = "run spatial-small -e resnet-spatial --results {results}"\n'
             'minutes = 5.0\nmin_cpus = 100000\n')
    text += ('[[step]]\nname = "cfp"\ncommand = "cfp analysis --model gpt --nproc 2 --work_dir {logs}/cfp --results '
             '{results}"\nminutes = 0.2\npoints = 1\n'
             '[[step]]\nname = "aceso"\ncommand = "aceso profile --prof-model-name gpt --prof-model-size tiny '
             '--prof-tp-size 1 --prof-mbs-list 1 --prof-warmup-times 1 --prof-repeat-times 1 --prof-comm-sizes 0-1 '
             '--prof-path {logs}/aceso/profiled-time --results {results}"\nminutes = 0.3\npoints = 2\n')
    for name, family in (("comms", "param_comms"), ("resharding", "resharding"), ("spatial", "spatial"),
                         ("cfp", "cfp"), ("aceso", "aceso")):
        steps = '"spatial", "spatial-timed"' if name == "spatial" else f'"{name}"'
        text += f'[[target]]\nname = "{name}"\nfamily = "{family}"\ntitle = "{name}"\nsteps = [{steps}]\n'
    plan = tmp_path / "plan.toml"
    plan.write_text(text)
    return plan


@pytest.mark.distributed
def test_one_command_reproduces_every_family_and_the_page_renders(tmp_path: Path) -> None:
    plan = tiny_plan(tmp_path)
    folders = ["--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"),
               "--logs", str(tmp_path / "logs")]
    proc = reproflow("reproduce", "--plan", str(plan), *folders, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # Live progress (one line per finished point when not on a terminal), then the summary.
    progress = re.findall(r"^\[\d+:\d\d:\d\d elapsed, ~\d+:\d\d:\d\d left\] (\d+)/(\d+) points \| step (\d)/5",
                          proc.stdout, re.M)
    assert len(progress) == 9 and progress[-1][:2] == ("9", "9"), proc.stdout
    assert "5 step(s) in" in proc.stdout and "9 points measured, 0 measured before, 0 failed" in proc.stdout
    assert "step spatial-timed does not run here: its claim takes a CPU core per rank (100000)" in proc.stdout
    assert all((tmp_path / "logs" / "reproduce" / f"{s}.log").is_file() for s in ("comms", "cfp", "aceso"))

    reports = tmp_path / "reports"
    claims = pd.read_csv(reports / "claims.csv")
    assert set(claims["family"]) == {"param_comms", "resharding", "spatial", "cfp", "aceso"}
    assert set(claims["status"]) <= {HOLDS, FAILS, INCONCLUSIVE, NOT_MEASURED, NOT_COMPARED, NOT_APPLICABLE}
    status = dict(zip(claims["claim"], claims["status"], strict=True))
    # The tiny resharding suite asks for no emulated network: its rows ran on loopback, which cannot judge it.
    resharding = claims[claims["family"] == "resharding"].iloc[0]
    assert resharding["status"] == NOT_APPLICABLE and "ran on loopback, unshaped" in resharding["where"]
    # The tiny sweep measures each size once: a timing without repeats has no interval, so decides nothing.
    grows = claims.set_index("claim").loc["busBW grows with message size"]
    assert grows["status"] == INCONCLUSIVE and ONCE in grows["cases"], grows.to_dict()
    assert status["spatial parallelism's logits and gradients equal the serial (unsplit) model's"] == HOLDS
    # Its timing left out, the speed-up is not applicable where the checks' 5 ranks shared fewer cores.
    timed = status["spatial tiles are faster than layer parallelism alone"]
    assert timed == (NOT_APPLICABLE if len(os.sched_getaffinity(0)) < 5 else NOT_MEASURED)
    assert status["CFP's plan is at least as fast as the Alpa-style plan"] == NOT_MEASURED  # analysis only
    assert re.search(r"claims \(.*\): \d+ holds, \d+ does not hold, \d+ inconclusive, \d+ not measured", proc.stdout)
    # The run as data: its steps with their points, every claim with the verdict claims.csv has.
    summary = json.loads((reports / "summary.json").read_text())
    jsonschema.validate(summary, json.loads(SCHEMA.read_text()), cls=jsonschema.Draft202012Validator)
    assert [s["name"] for s in summary["steps"]] == ["comms", "resharding", "spatial", "cfp", "aceso"]
    assert sum(s["measured"] for s in summary["steps"]) == 9 and summary["run"]["command"][1] == "reproduce"
    assert {c["claim"]: c["status"] for c in summary["claims"]} == status

    page = (reports / "report.html").read_text()
    figures = page.count('src="data:image/png;base64,')
    assert figures >= 3 and "<link" not in page and "<script" not in page  # self-contained
    # The claims lead as one picture, above their table.
    lead = page[page.index('<section id="claims">'):]
    assert lead.index('alt="claims_forest"') < lead.index("<table")
    # The markdown twin links only files that exist.
    twin = reports / "report.md"
    for link in re.findall(r"\]\(([^)#]+)\)", twin.read_text()):
        assert (reports / link).is_file(), link
    _check_in_chromium(reports / "report.html", figures)

    # Only what is missing runs again.
    again = reproflow("reproduce", "--plan", str(plan), "--only", "comms", *folders, timeout=300)
    assert again.returncode == 0 and "0 points measured, 2 measured before, 0 failed" in again.stdout

    archive = tmp_path / "share.tar.gz"
    proc = reproflow("archive", "--out", str(archive), *folders)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("share/MANIFEST.json").read())  # type: ignore[union-attr]
        page_member = tar.extractfile("share/reports/report.html").read()  # type: ignore[union-attr]
    for wanted in ("share/workflows/reproduce/targets.toml", "share/sbatch/param-demo.sbatch",
                   "share/logs/reproduce/comms.log", "share/reports/claims.csv"):
        assert wanted in names
    assert any(n.startswith("share/results/tiny-comms/comms/") and n.endswith(".csv") for n in names)
    assert len(manifest["files"]) == len(names) - 1
    assert manifest["files"]["reports/report.html"]["sha256"] == hashlib.sha256(page_member).hexdigest()


def _check_in_chromium(page: Path, figures: int) -> None:
    """The page in a real headless Chromium (Debian's, driven by Playwright): it loads, every figure
    decodes and is laid out, every link resolves, no console error; screenshots for a reader."""
    with chromium_tab() as (tab, errors):
        tab.goto(page.as_uri(), wait_until="load")
        assert tab.title() == "reproflow report"
        # Every figure decoded and laid out.
        images = tab.evaluate("[...document.images].map(i => [i.alt, i.complete && i.naturalWidth > 0, "
                              "i.getBoundingClientRect().width])")
        assert len(images) == figures and all(ok and width > 100 for _, ok, width in images), images
        # Every link leads somewhere: in-page anchors to an element, nothing to files outside the page.
        hrefs = tab.eval_on_selector_all("a[href]", "links => links.map(a => a.getAttribute('href'))")
        assert hrefs and all(h.startswith("#") for h in hrefs), hrefs
        assert [h for h in hrefs if tab.locator(f"[id='{h[1:]}']").count() == 0] == []
        sections = tab.eval_on_selector_all("section", "found => found.map(s => s.id)")
        for family in ("param-comms", "resharding", "spatial", "cfp", "aceso"):
            assert f"family-{family}" in sections
        assert tab.locator("tr.holds").count() >= 2
        assert errors == [], errors
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        top = tab.screenshot(path=ARTIFACTS / "report-top.png")
        full = tab.screenshot(path=ARTIFACTS / "report-full.png", full_page=True)
    assert len(top) > 10_000 and len(full) > len(top)


def test_a_slurm_steps_job_lines_reach_the_progress_as_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The supervisor's lines (job states, attempts, retries) are events that `reproduce` shows: rewording
    a line cannot silence it, as a pattern over printed text could."""
    from reproflow.app.reproduce import steps
    from reproflow.launch import retry
    from reproflow.store.events import ENV, read_events

    feed = tmp_path / "events.jsonl"
    monkeypatch.setenv(ENV, str(feed))
    retry.say("reproflow: any wording at all: job 42 retried on other nodes")
    (event,), _ = read_events(feed, 0)
    assert event == {"event": "supervisor", "text": "reproflow: any wording at all: job 42 retried on other nodes"}
    shown: list[str] = []
    progress = Progress([], out=shown.append, tty=False)
    steps._apply(event, {"measured": 0}, [], progress)
    assert "   reproflow: any wording at all: job 42 retried on other nodes" in shown
