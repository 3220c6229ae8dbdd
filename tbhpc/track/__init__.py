"""Trackers: a training run's curves where people already look (TensorBoard, trackio, Weights &
Biases, MLflow), next to the run directory's DuckDB, which stays the record of truth.

    settings.py   which trackers exist, which extra installs each, where each writes and
                  whether it may reach the network (pure: golden-tested)
    backends.py   one small adapter per tracker: open (or reopen), scalars, tables, close
    fanout.py     rank 0's trackers behind one queue each: a tracker that fails or stops
                  answering costs one warning line, never a step
    evals.py      an export's eval summary logged to the run's trackers at the step it evaluated
    samples.py    a step's sample episodes as a table (task, reward, the transcript `tbhpc show` prints)
"""
