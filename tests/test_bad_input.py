"""Issue 33: every refusal a message, every status true. Bad input as a new user types it, each
answered by one line that names the problem and a fix that works when pasted, never a traceback and
never silence. CPU, offline."""

from __future__ import annotations

import pytest

from hf_pretrain.economics import plan
from hf_pretrain.economics.prices import PriceError


# ---------------------------------------------------------------------- a price file
def test_a_price_file_naming_an_unknown_gpu_is_refused_with_the_nearest_names(tmp_path, capsys):
    prices = tmp_path / "prices.yaml"
    prices.write_text("H100: 0.50\nH1OO PCie: 0.10\n")
    with pytest.raises(PriceError, match=r"no GPU `H1OO PCie` in the GPU table; did you mean `H100 PCIe`"):
        plan.gpu_prices(str(prices))
    # the command says it in one line, with or without --gpu (the file was once never read without it)
    for extra in ([], ["--gpu", "all"], ["--gpu", "H100"]):
        assert plan.main(["--recipe", "1b", "--prices", str(prices), *extra]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"hf-pretrain plan: error: {prices}: no GPU `H1OO PCie` in the GPU table; did you mean "
            "`H100 PCIe`? (every GPU: gpus.yaml)"
        ], err


# ---------------------------------------------------------------------- the doctor's disk check
def test_the_disk_check_sizes_a_checkpoint_from_its_real_bytes_and_passes_a_disk_the_run_fits(
    reference_run, smoke_data, tmp_path, monkeypatch
):
    """Issue 33: a flat 64 MB beside the tensors made the smoke model's 16 MB checkpoint 80 MB, 5x, and
    refused a disk the run fits."""
    import shutil
    from collections import namedtuple

    from hf_pretrain.checkpoints.store import list_checkpoints
    from hf_pretrain.config import load_recipe
    from hf_pretrain.model import recipe_parameter_count
    from hf_pretrain.preflight import disk

    run_dir, _ = reference_run
    real = disk.newest_checkpoint_bytes(run_dir)
    assert real == sum(f.stat().st_size for f in list_checkpoints(run_dir)[0].path.rglob("*") if f.is_file())
    recipe = load_recipe("smoke", {"data_dir": str(smoke_data), "output_dir": str(tmp_path / "new")})
    estimate = disk.checkpoint_bytes(recipe_parameter_count(recipe), disk.tokenizer_bytes(recipe))
    assert real <= estimate <= 1.15 * real, (estimate, real)  # an upper bound, and a close one
    # a disk with room for the run's 3 checkpoints and its export, and little more, passes
    needs = 3 * estimate + 4 * recipe_parameter_count(recipe)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(2 * needs, needs, int(1.1 * needs)))
    result = disk.check_disk_space(recipe)
    assert result.status == "pass", result.reason
