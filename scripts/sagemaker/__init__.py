"""The SageMaker side: build and push the image, package the model repository, deploy it (an
endpoint, asynchronous, multi-model, inference components, Batch Transform) and compare costs.

``python -m scripts.sagemaker COMMAND`` runs a command (``__main__``): ``deploy``, ``build-and-push``,
``package-models``, ``cost``. The commands' modules have the same names (``main(argv)`` each);
``endpoint``, ``components``, ``scaling``, ``transform`` and ``resources`` are deploy's parts.
"""
