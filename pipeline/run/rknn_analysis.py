"""The RKNN-Toolkit2 child of an int8 build: rknn_driver.py's build, export and simulation, then
(with --analysis DIR) the toolkit's accuracy_analysis of the model it built, on the same inputs:
in its simulator, the int8 model against the toolkit's own fp32 run of the same graph, layer by
layer, written to DIR/error_analysis.txt (with per-layer dumps the caller drops).

The simulator runs only a model built in the same process, so the analysis runs in the driver's
process, before the driver releases its model: this script runs the driver's main() with the
toolkit's RKNN class replaced by a subclass whose release() runs the analysis first. The driver
looks the class up when main() runs and releases the model once, after exporting the file and
saving the simulated outputs: the analysis cannot change either.

Why not a flag of the driver: the toolkit writes heap addresses into .rknn files, and the
driver's own source text moves the heap. Any edit of rknn_driver.py changes the bytes of every
fp16 build (100 bytes of comment changed 9 bytes of ppocr_cls's): this script runs for int8
builds only, and fp16 builds keep their bytes. Like the driver, it imports nothing of `pipeline`.

    python rknn_analysis.py --driver rknn_driver.py [--analysis DIR] <rknn_driver.py's arguments>
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours = argparse.ArgumentParser(prog="rknn_analysis.py", add_help=False, allow_abbrev=False)
    ours.add_argument("--driver", required=True, help="rknn_driver.py (the build, simulation, export)")
    ours.add_argument("--analysis", help="the folder accuracy_analysis writes into")
    args, rest = ours.parse_known_args(argv)
    feeds = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    feeds.add_argument("--input", action="append", default=[])
    inputs = feeds.parse_known_args(rest)[0].input  # the driver's golden inputs (.npy, NCHW)

    spec = importlib.util.spec_from_file_location("rknn_driver", args.driver)
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    if args.analysis:
        import rknn.api  # RKNN-Toolkit2: in its own venv only (this runs there)

        class Analysed(rknn.api.RKNN):
            def release(self):
                start = time.monotonic()
                ret = self.accuracy_analysis(inputs=inputs, output_dir=args.analysis, target=None)
                print(f"accuracy_analysis returned {ret} after {time.monotonic() - start:.1f} s")
                if ret != 0:  # the toolkit printed why
                    print(f"RKNN-Toolkit2 accuracy_analysis failed (returned {ret}): see its "
                          f"messages above", file=sys.stderr)
                    raise SystemExit(5)
                super().release()

        rknn.api.RKNN = Analysed
    return driver.main(rest)


if __name__ == "__main__":
    sys.exit(main())
