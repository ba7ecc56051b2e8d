"""Logistic-regression model serving with scikit-learn (vHive "lr_serving").

At import a LogisticRegression is trained on a deterministic synthetic data
set (numpy RNG, fixed seed, 2000 x 20) and a fixed batch of 100 query rows
is generated; prediction is warmed up once.  Each call predicts for
event["x"] and for the fixed batch.

Event: {"x": list of 20 numbers (default: a fixed vector)}.
Returns the class and probability for x and the batch's classes and
probabilities, rounded to 6 decimals.
"""

import numpy as np
from sklearn.linear_model import LogisticRegression

N_SAMPLES, N_FEATURES, N_BATCH = 2000, 20, 100

_rng = np.random.default_rng(42)
_X = _rng.normal(size=(N_SAMPLES, N_FEATURES))
_w = _rng.normal(size=N_FEATURES)
_y = (_X @ _w + 0.5 * _rng.normal(size=N_SAMPLES) > 0.0).astype(np.int64)

MODEL = LogisticRegression(C=1.0, solver="lbfgs", max_iter=1000)
MODEL.fit(_X, _y)
TRAIN_ACCURACY = round(float(MODEL.score(_X, _y)), 6)
del _X, _y

BATCH = _rng.normal(size=(N_BATCH, N_FEATURES))
DEFAULT_X = [round(0.1 * (i - N_FEATURES / 2), 3) for i in range(N_FEATURES)]

# warm the predict path (input validation, lazily imported helpers)
MODEL.predict_proba(BATCH[:2])
MODEL.predict(BATCH[:2])


def handler(event, context):
    event = event if isinstance(event, dict) else {}
    x = event.get("x", DEFAULT_X)
    if not isinstance(x, list) or len(x) != N_FEATURES:
        raise ValueError("x must be a list of %d numbers" % N_FEATURES)
    xa = np.asarray([float(v) for v in x], dtype=np.float64).reshape(1, -1)
    p1 = MODEL.predict_proba(xa)[0, 1]
    batch_proba = MODEL.predict_proba(BATCH)[:, 1]
    batch_pred = MODEL.predict(BATCH)
    return {
        "prediction": int(MODEL.predict(xa)[0]),
        "probability": round(float(p1), 6),
        "batch_predictions": [int(v) for v in batch_pred],
        "batch_probabilities": [round(float(v), 6) for v in batch_proba],
        "batch_positive": int(batch_pred.sum()),
        "train_accuracy": TRAIN_ACCURACY,
    }
