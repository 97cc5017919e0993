"""What a run takes and what it costs, on a GPU you have or one you might rent: not only money.

- the cards: `gpus.py` + `gpus.yaml` (peaks, memory, bandwidth, typical prices), `prices.py` (your prices);
- GPU memory: `memory.py` (a step's peak bytes on one GPU, the micro-batch and checkpointing that fit);
- speed: `workload.py` (a token's FLOPs and kernel bytes), `performance.py` (the performance model:
  seconds per token on a card, the slow-node check), `published.py` (what it is checked against);
- the measurement store: `measurements.py` (what bench and training measured, per configuration, read
  before the model; the project's own runs in `measured.jsonl`), `check_records.py` (what `check` measured);
- money and loss during a run: `cost.py` (cost so far, per phase), `forecast.py` (the loss curve's fitted
  power law: where it is heading, what going further buys);
- `planning/`: the `hf-pretrain plan` command, which puts all of the above together before a run starts.

Everything here but `planning/` is an ingredient the run, the doctor, bench and check read; none of it
imports them (docs/architecture.md, "The arrows").
"""
