"""CompileCallback under Lightning's ModelParallelStrategy (FSDP2), 2 CPU processes on gloo: the fit runs,
verification compares each rank's own shards (no gather), every rank takes the same plan, and the
checkpoint keys are a plain model's. (Lightning's FSDPStrategy refuses CPU; its run is GPU-only.)"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("fsdp2_fit.py")


@pytest.mark.slow
def test_fsdp2_fit_verifies_on_shards_and_every_rank_takes_the_same_plan(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["sharded"] == "DTensor"  # the model really was sharded
    assert ranks[0]["decisions"] == ranks[1]["decisions"] and ranks[0]["compiled"] == ranks[1]["compiled"]
    whole = [d for d in ranks[0]["decisions"] if d[0] == "model"]
    # The whole model was tried and verified against eager on the shards (its DTensor gradients made
    # verification raise before, and the fit died on both ranks).
    assert whole and whole[0][2] is True, ranks[0]["decisions"]
    assert ranks[0]["keys"] == ranks[0]["plain_keys"]  # compiled in place: a plain model's keys
    assert ranks[0]["summary"]["graph_breaks"] == ranks[1]["summary"]["graph_breaks"]
