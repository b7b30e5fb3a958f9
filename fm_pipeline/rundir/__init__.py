"""A job's run directory and the records beside its checkpoints that every process of the job
agrees on: who may write them (lease.py). Imports no torch: the control side reads these too.
"""
