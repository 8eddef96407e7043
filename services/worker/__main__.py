"""`python -m services.worker`: serve this worker's models until SIGINT/SIGTERM (HANZO_WORKER_* env)."""

from __future__ import annotations

from services.common.service_main import run
from services.worker.server.app import WorkerApp
from services.worker.server.config import WorkerSettings

if __name__ == "__main__":
    run(
        lambda: WorkerApp(WorkerSettings.from_env()),
        lambda app: (
            f"WORKER_READY address={app.address} node_id={app.node_id} metrics_port={app.metrics_port} "
            f"models={','.join(app.host.models) or '-'} serving={app.serving}"
        ),
    )
