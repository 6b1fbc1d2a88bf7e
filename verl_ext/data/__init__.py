"""Data preparation in verl's convention (parquet rows with ``data_source``, chat ``prompt``, ``ability``,
``reward_model.ground_truth`` and ``extra_info``), one module per job:

* ``python -m verl_ext.data.deepscaler``: DeepScaleR-hard-1k-style JSON (problem / answer / solution) into the
  training parquet, the reference solution kept in ``extra_info["solution"]`` for GEC's solution branch;
* ``python -m verl_ext.data.eval_suites``: AIME, AMC, MATH500, Minerva and OlympiadBench into one validation
  parquet per suite, each suite its own ``data_source``.

Prompts follow the Qwen2.5-Math format the papers used (``common.SYSTEM_PROMPT`` + the problem as user turn).
"""
