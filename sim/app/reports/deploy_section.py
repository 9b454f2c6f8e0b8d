"""The "Deploy" section of the capacity reports: the chosen config's fleet, its
``vllm serve`` YAML and the command per replica (sim/app/runs/deploy_config.py), and what
servesim leaves to the operator; markdown for capacity.md, HTML for capacity.html."""

from __future__ import annotations

import html

from sim.app.reports.markdown import md_inline
from sim.app.runs.deploy_config import (
    DECIDED_ELSEWHERE,
    SERVE_FILE,
    Deployment,
    decided_elsewhere,
)


def deploy_markdown(d: Deployment) -> list[str]:
    """The "Deploy" section of capacity.md: the fleet, the YAML, the commands, notes."""
    size = (f"{d.replicas} replica(s) of TP {d.tensor_parallel_size} on {d.gpu}, behind "
            f"a load balancer routing like servesim's {d.router} router"
            if d.replicas else f"TP {d.tensor_parallel_size} per replica on {d.gpu} (no "
            "target: replicas not sized)")
    if d.disagg is not None and d.replicas:
        size = (f"{d.disagg}: {d.replicas} engines ({d.engines_text()}) on {d.gpu}, behind "
                f"vLLM's disaggregated-serving proxy, each pool routed like servesim's "
                f"{d.router} router")
    return [f"{size}. `{SERVE_FILE}` (written beside this report; `servesim run --config "
            f"{SERVE_FILE} --gpu {d.gpu}` reads it back):", "", "```yaml",
            d.yaml().rstrip("\n"), "```", "",
            "One command per replica:" if d.disagg is None else "One command per engine:",
            "", "```sh",
            *d.commands(), "```", "",
            *[f"- {n}" for n in (*d.notes, DECIDED_ELSEWHERE if d.disagg is None else
                                 decided_elsewhere("where the proxy and the engines run"))]]


def deploy_html(d: Deployment) -> str:
    """The section's HTML: deploy_markdown's lines, code blocks as <pre>."""
    out, code = [], False
    for line in deploy_markdown(d):
        if line.startswith("```"):
            out.append("</pre>" if code else "<pre>")
            code = not code
        elif code:
            out.append(html.escape(line) + "\n")
        elif line:
            out.append(f"<p>{md_inline(line.removeprefix('- '))}</p>")
    return "".join(out)
