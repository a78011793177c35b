"""What the interleaved bench scripts read back from a run's files (bench/cpu_step/vs_torch.sh,
bench/parallelism/vs_peers.sh and the summaries over them): train_gpt's --metrics JSONL and
stdout log (loom_LABEL_rR.*), the peers' RESULT json per rank (peer_LABEL_rR.rankN.json,
bench/peers/python/harness.py)."""
import glob
import json
import re
import statistics


def loom_ms(d, label, r):
    """Loom's median step from step 5 on (its --metrics file)."""
    steps = [json.loads(line)["ms_per_step"] for line in open(f"{d}/loom_{label}_r{r}.jsonl")]
    return statistics.median(steps[5:])


def peer_results(d, label, r):
    return [json.load(open(f)) for f in sorted(glob.glob(f"{d}/peer_{label}_r{r}.rank*.json"))]


def peer_ms(d, label, r):
    """The peer's slowest rank's median step from step 5 on; NaN when it wrote none."""
    results = peer_results(d, label, r)
    return max(x["median_ms_5_19"] for x in results) if results else float("nan")


def loom_rss_above_start(d, label, r):
    """MiB of peak RSS above the RSS before the model was built, from train_gpt's "process
    memory" line (its chief rank); None when the log has none."""
    try:
        text = open(f"{d}/loom_{label}_r{r}.log").read()
    except OSError:
        return None
    m = re.search(r"process memory \(this rank\): peak RSS [0-9.]+ MiB, (-?[0-9.]+) MiB above", text)
    return float(m.group(1)) if m else None


def peer_rss_above_start(d, label, r):
    """The same for the peer: peak_rss_mib - rss_before_model_mib, its largest rank; None when
    its results predate rss_before_model_mib."""
    above = [x["peak_rss_mib"] - x["rss_before_model_mib"] for x in peer_results(d, label, r)
             if x.get("rss_before_model_mib") is not None]
    return max(above) if above else None
