"""Distribution: the strategies `strategy=` names, who is the chief, collective errors, the Keras workaround.

Only this package talks to `tf.distribute` beyond what the tasks hand a strategy.
"""
