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
