// Image resize with jimp (pure JavaScript). A 320x240 test image is generated
// (and PNG-encoded) at init; each invocation decodes it, resizes it to the
// requested width and returns the new size and a digest of the PNG.
const Jimp = require('jimp');
const crypto = require('crypto');

let sourcePng;

async function makeSource() {
  const img = new Jimp(320, 240, 0x000000ff);
  img.scan(0, 0, img.bitmap.width, img.bitmap.height, function (x, y, idx) {
    this.bitmap.data[idx] = (x * 255) / 320;
    this.bitmap.data[idx + 1] = (y * 255) / 240;
    this.bitmap.data[idx + 2] = ((x ^ y) & 0xff);
    this.bitmap.data[idx + 3] = 255;
  });
  return img.getBufferAsync(Jimp.MIME_PNG);
}

const ready = makeSource().then((png) => { sourcePng = png; });

exports.handler = async (event) => {
  await ready;
  const width = Math.max(1, Math.min(1024, (event && event.width) || 64));
  const img = await Jimp.read(sourcePng);
  img.resize(width, Jimp.AUTO);
  const out = await img.getBufferAsync(Jimp.MIME_PNG);
  return {
    source: { width: 320, height: 240, bytes: sourcePng.length },
    width: img.bitmap.width,
    height: img.bitmap.height,
    bytes: out.length,
    sha256: crypto.createHash('sha256').update(out).digest('hex'),
  };
};
