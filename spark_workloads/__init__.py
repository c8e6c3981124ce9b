"""PySpark jobs that build the stock-quote workloads of the paper's evaluation (§7).

:mod:`spark_workloads.stock_workload` is the job (``python -m spark_workloads.stock_workload``
or ``spark-submit spark_workloads/stock_workload.py``); it reads quotes with
:mod:`~spark_workloads.quote_input`, derives synthetic symbols with
:mod:`~spark_workloads.series` and measures selectivity with
:mod:`~spark_workloads.selectivity`.
"""
