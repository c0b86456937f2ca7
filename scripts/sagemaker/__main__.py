"""``python -m scripts.sagemaker COMMAND ...``: the SageMaker side's commands (``--help`` lists them)."""

import sys

from scripts.commands import Command, run

COMMANDS = {
    "deploy": Command(
        "scripts.sagemaker.deploy",
        "deploy the image as an endpoint or a Batch Transform job, or delete what either made",
    ),
    "build-and-push": Command("scripts.sagemaker.build_and_push", "build the serving image and push it to Amazon ECR"),
    "package-models": Command(
        "scripts.sagemaker.package_models",
        "package a Triton model repository as model.tar.gz (or one archive per model)",
    ),
    "metrics": Command(
        "scripts.sagemaker.metrics_cli",
        "print the per-model metric filters, dashboard and alarms deploy would create (no AWS call)",
    ),
    "cost": Command("scripts.sagemaker.cost", "compare one endpoint per model with one shared endpoint"),
}

sys.exit(run("python -m scripts.sagemaker", "The SageMaker side: image, model archives, deployment, cost.", COMMANDS))
