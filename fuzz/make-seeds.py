"""Regenerate the hand-made seeds of fuzz/corpus (the image and working-set seeds are
copied from a real snapshot of build/samples/python/helloworld: see README.md)."""
import io, os, zipfile, base64, json

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)

def put(target, name, data):
    d = os.path.join(here, 'corpus', target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)

def zip_of(entries):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w', zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            z.writestr(info, data)
    return buf.getvalue()

hello = open(os.path.join(root, 'samples/python/helloworld/handler.py'), 'rb').read()
put('bundle_extract', 'helloworld.zip', zip_of([('handler.py', hello, 0o644)]))
put('bundle_extract', 'nested.zip', zip_of([('pkg/', b'', 0o40755), ('pkg/__init__.py', b'', 0o644),
                                             ('pkg/run.sh', b'#!/bin/sh\n', 0o755)]))
put('bundle_extract', 'escape.zip', zip_of([('../evil.py', b'x', 0o644)]))

# The request botocore 1.35 signed (SigV4Auth(creds, 'lambda', 'us-east-1')) in the
# verifier's unit test, in the fuzz target's text format.
sig = '321aa490f85c5eda41c48eef9bca8b12559a53967a97836674faddbc1c6b98aa'
req = '\n'.join([
    'POST', '/2015-03-31/functions/my-fn%3A%24LATEST/invocations', 'Qualifier=%24LATEST&b=x%20y',
    'Host: 127.0.0.1:9000', 'X-Amz-Invocation-Type: RequestResponse', 'Content-Type: application/json',
    'X-Amz-Date: 20240501T120000Z',
    'Authorization: AWS4-HMAC-SHA256 Credential=AKIDTHAWTEST/20240501/us-east-1/lambda/aws4_request, '
    'SignedHeaders=content-type;host;x-amz-date;x-amz-invocation-type, Signature=' + sig,
]) + '\n\n{"name": "thaw"}'
put('sigv4_verify', 'botocore-invoke', req.encode())

create = {'FunctionName': 'hello', 'Runtime': 'python3.11', 'Handler': 'handler.handler', 'Role': 'arn:aws:iam::1:role/r',
          'Timeout': 10, 'MemorySize': 256, 'Environment': {'Variables': {'A_B': '1'}},
          'Code': {'ZipFile': base64.b64encode(zip_of([('handler.py', hello, 0o644)])).decode()}}
put('api_request', 'create', b'POST\n/2015-03-31/functions\n-\n' + json.dumps(create).encode())
put('api_request', 'invoke-arn', b'POST\n/2015-03-31/functions/arn:aws:lambda:us-east-1:123456789012:function:hello:%24LATEST/invocations\n$LATEST\n{}')
put('api_request', 'get-config', b'GET\n/2015-03-31/functions/hello/configuration\n-\n')

# Heads' copies (fuzz_targets/store_head_copy.rs): [part size, limit / 4, the object].
def head_copy(manifest, pack):
    return b'thawhd01' + len(manifest).to_bytes(4, 'little') + manifest + pack
put('store_head_copy', 'manifest-and-pack', bytes([7, 0]) + head_copy(b'{"format":4,"files":[]}', b'state.bin+ws.trace+pages' * 4))
put('store_head_copy', 'pack-only', bytes([255, 0]) + b'state.bin+ws.trace+pages')
put('store_head_copy', 'over-the-limit', bytes([3, 5]) + head_copy(b'{}', b'p' * 64))
put('store_head_copy', 'cut-in-the-manifest', bytes([1, 0]) + head_copy(b'{"format":4}', b'')[:16])
# Split copies: the first object (magic thawhd02, the manifest, the pack's first bytes),
# then the second object's bytes, then their count + 2 (0: not requested, 1: missing).
def split_copy(manifest, first, rest, r=None):
    return b'thawhd02' + len(manifest).to_bytes(4, 'little') + manifest + first + rest + bytes([len(rest) + 2 if r is None else r])
put('store_head_copy', 'split', bytes([5, 0]) + split_copy(b'{"format":7}', b'state.bin+ws.trace+', b'pages' * 8))
put('store_head_copy', 'split-second-missing', bytes([0x83, 0]) + split_copy(b'{"format":7}', b'state.bin+ws.trace+', b'', 1))
put('store_head_copy', 'split-second-not-asked', bytes([9, 0]) + split_copy(b'{"format":7}', b'state.bin+ws.trace+', b'', 0))
put('store_head_copy', 'split-over-the-limit', bytes([3, 8]) + split_copy(b'{}', b'p' * 16, b'q' * 40))
# A diff's split copy carrying its base's start (thawhd03: the base's length and first object after the manifest).
def carrying_copy(manifest, base, first, rest):
    return b'thawhd03' + len(manifest).to_bytes(4, 'little') + manifest + len(base).to_bytes(4, 'little') + base + first + rest + bytes([len(rest) + 2])
base_first = b'thawhd02' + (6).to_bytes(4, 'little') + b'{base}' + b'base-state+'
put('store_head_copy', 'diff-carrying-base', bytes([6, 0]) + carrying_copy(b'{"format":7}', base_first, b'state.bin+ws.trace+', b'pages' * 8))
