import json

from rlexp.train import run


def test_two_step_train_on_tiny_writes_metrics(tiny_cfg, tmp_path):
    cfg = tiny_cfg()
    result = run(cfg)
    assert result.last_step == 2
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("reward/mean", "accuracy", "entropy/mean", "length/mean", "time/generate_s", "grad_norm", "loss/total"):
        assert key in rows[0], key
