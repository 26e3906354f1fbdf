"""Run in an SGLang CPU environment by tests/test_page_size.py: the release's own page-size pass
(``arg_groups/overrides.py _mla_backend_page_constraints``, 0.5.15+) on a grid of one backend flag x page
size, printed as JSON [flag, backend, page typed, page the release resolves]."""

import itertools
import json
import sys
from types import SimpleNamespace

from sglang.srt.arg_groups import overrides

fn = overrides._mla_backend_page_constraints
backends = sys.argv[1].split(",")
flags = [
    "attention_backend",
    "decode_attention_backend",
    "prefill_attention_backend",
    "speculative_draft_attention_backend",
]
out = []
for flag, b, page in itertools.product(flags, backends, [1, 16, 32, 64, 128]):
    view = SimpleNamespace(**{f: None for f in flags}, page_size=page)
    setattr(view, flag, b)
    out.append([flag, b, page, fn(view).get("page_size", page)])
print(json.dumps(out))
