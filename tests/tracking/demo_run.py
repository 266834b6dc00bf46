"""Log a small run to real trackers, in its own process (helper for test_logger.py, not a test).

Usage: python demo_run.py SPEC_JSON

SPEC_JSON holds output_dir, project, run_name, report_to, config and per-step scalars, histograms
and tables. A separate process gives trackio a fresh import under the test's TRACKIO_DIR (trackio
reads it once, at import) and keeps W&B's service process and exit hooks out of pytest.
"""

import json
import sys

import numpy as np
from accelerate import Accelerator

from rlhfkit.tracking.logger import RunLogger
from rlhfkit.tracking.trackers import make_trackers


def main(spec_path: str) -> None:
    spec = json.load(open(spec_path))
    trackers = make_trackers(
        spec["report_to"], project=spec["project"], run_name=spec["run_name"], output_dir=spec["output_dir"]
    )
    accelerator = Accelerator(log_with=trackers)
    logger = RunLogger(
        accelerator,
        output_dir=spec["output_dir"],
        config=spec["config"],
        project=spec["project"],
        run_name=spec["run_name"],
        report_to=spec["report_to"],
    )
    for entry in spec["steps"]:
        step = entry["step"]
        # NumPy scalars on purpose: accelerate's TensorBoard tracker would drop them silently.
        logger.log({k: np.float32(v) for k, v in entry["scalars"].items()}, step)
        logger.log_histograms({k: np.asarray(v) for k, v in entry["histograms"].items()}, step)
        table = entry["table"]
        extra = {"extra_columns": table["extra"], "extra_before": table["extra_before"]} if "extra" in table else {}
        logger.log_table(table["key"], table["columns"], table["rows"], step, **extra)
    logger.finish()


if __name__ == "__main__":
    main(sys.argv[1])
