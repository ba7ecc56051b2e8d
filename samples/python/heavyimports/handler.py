"""Cold start dominated by imports (numpy + pandas + scipy.stats).

The handler does a small deterministic computation with them.
"""

import numpy as np
import pandas as pd
from scipy import stats

print("heavyimports: numpy %s, pandas %s" % (np.__version__, pd.__version__))


def handler(event, context):
    n = 64
    seed = 0
    if isinstance(event, dict):
        n = max(2, min(int(event.get("n", 64)), 100000))
        seed = int(event.get("seed", 0))
    x = np.arange(n, dtype=np.float64)
    y = 3.0 * x + 2.0 + np.sin(x + seed)
    df = pd.DataFrame({"x": x, "y": y, "bucket": (x.astype(np.int64) % 4)})
    means = df.groupby("bucket")["y"].mean()
    fit = stats.linregress(df["x"].to_numpy(), df["y"].to_numpy())
    return {
        "n": n,
        "sum_y": round(float(df["y"].sum()), 6),
        "bucket_means": [round(float(v), 6) for v in means.tolist()],
        "slope": round(float(fit.slope), 6),
        "intercept": round(float(fit.intercept), 6),
    }
