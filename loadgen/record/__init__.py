"""The run record: the figures a summary holds, summaries, SLO judgement, findings,
the typed record (``run.json``, ``summary.json``) and its reading back, the run
directory's append-only files, and the tables declared once. Above sending.
"""
