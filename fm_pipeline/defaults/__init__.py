"""What the product reads at run time, shipped inside the package (a wheel install or a
plain clone has the same files):

    demo.yaml      the embedded default job spec (`fm demo`, and every `--job` left out)
    tenants.yaml   the default tenants of `fm api serve` and `fm api kueue render`
    dev_cluster_tenants.yaml   the tenants `fm dev cluster up` applies as Kueue objects

The repository's configs/ holds links to these two, so the documented paths work too.
The CRD schemas `fm k8s render` validates against are fm_pipeline/launch/crd_schemas/.
"""

from __future__ import annotations

from pathlib import Path

DEFAULTS = Path(__file__).resolve().parent
DEMO_JOB = DEFAULTS / "demo.yaml"
TENANTS = DEFAULTS / "tenants.yaml"
DEV_CLUSTER_TENANTS = DEFAULTS / "dev_cluster_tenants.yaml"
