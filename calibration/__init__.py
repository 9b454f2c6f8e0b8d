"""Calibration: model and GPU specs (specs.py, gpus.py), the vLLM-style KV-cache memory plan
(memory.py) and the analytic roofline cost model (roofline.py). Everything here runs on CPU;
torch is imported only inside the measuring modules, lazily."""
