"""The config tree inside the package, extended by a user's own config directory on Hydra's search path."""

from __future__ import annotations

from pathlib import Path

import rlexp
from rlexp.config.paths import CONF_DIR


def test_conf_dir_is_inside_the_package():
    assert Path(CONF_DIR).parent == Path(rlexp.__file__).parent
    assert (Path(CONF_DIR) / "config.yaml").is_file()


def test_a_users_config_dir_adds_a_method(tmp_path, capsys):
    """``rlexp train --config-dir <dir>``: the user's ``algorithm/my_method.yaml`` composes beside ours."""
    (tmp_path / "algorithm").mkdir()
    (tmp_path / "algorithm" / "my_method.yaml").write_text(
        "defaults:\n  - grpo\n  - _self_\nname: my_method\nfamily: group-baseline\nloss:\n  eps_high: 0.31\n"
    )
    from rlexp.cli import main

    main(["train", "--config-dir", str(tmp_path), "algorithm=my_method", "model=tiny", "--cfg", "job"])
    out = capsys.readouterr().out
    assert "name: my_method" in out and "eps_high: 0.31" in out and "rlexp.algorithms.losses.clip.ppo_clip" in out
