"""Command-line entry points (thin: parse, call, print): ``python -m progpo.cli.{train,train_ray,sft,evaluate,
bench,plot,data,docs,learning_report}``. Every training CLI builds its flags with :mod:`progpo.run.flags`.
"""
