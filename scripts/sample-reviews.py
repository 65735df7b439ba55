#!/usr/bin/env python3
"""Rewrite the `request.object` of manifests/samples/reviews/jobset-mode-create-*.json from the
JobSet-mode samples manifests/samples/jobset-pi-*.yaml, keeping the rest of each review.

tests/manifests.rs checks that each review's object is its sample; run this after editing a
sample: `python3 scripts/sample-reviews.py` (needs PyYAML).
"""

import json
from pathlib import Path

import yaml

SAMPLES = Path(__file__).resolve().parent.parent / "manifests" / "samples"

for sample in sorted(SAMPLES.glob("jobset-pi-*.yaml")):
    implementation = sample.stem.removeprefix("jobset-pi-")
    path = SAMPLES / "reviews" / f"jobset-mode-create-{implementation}.json"
    review = json.loads(path.read_text())
    review["request"]["object"] = yaml.safe_load(sample.read_text())
    path.write_text(json.dumps(review, indent=2) + "\n")
    print(f"{path.relative_to(SAMPLES.parent.parent)}: object from {sample.name}")
