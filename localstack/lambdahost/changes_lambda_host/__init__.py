"""A LocalStack Lambda runtime executor that needs no container engine.

Select it with LAMBDA_RUNTIME_EXECUTOR=host. See executor.py.
"""
