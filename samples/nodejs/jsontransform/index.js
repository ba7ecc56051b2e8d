// JSON transform: parse, reshape, aggregate and re-serialize a document.
// Uses the event's "doc" if given, else a generated document of "rows" orders.
function generate(rows) {
  const regions = ['north', 'south', 'east', 'west'];
  const orders = [];
  for (let i = 0; i < rows; i++) {
    orders.push({
      id: `order-${i}`,
      region: regions[i % regions.length],
      items: [{ sku: `sku-${i % 17}`, qty: 1 + (i % 5), price: 3.5 + (i % 11) }, { sku: `sku-${(i * 7) % 17}`, qty: 2, price: 9.25 }],
      tags: i % 3 === 0 ? ['priority'] : [],
    });
  }
  return { orders };
}

exports.handler = async (event) => {
  const doc = (event && event.doc) || generate((event && event.rows) || 500);
  const text = JSON.stringify(doc);
  const parsed = JSON.parse(text);
  const byRegion = {};
  for (const o of parsed.orders) {
    const total = o.items.reduce((s, it) => s + it.qty * it.price, 0);
    const r = (byRegion[o.region] ||= { orders: 0, total: 0, priority: 0 });
    r.orders += 1;
    r.total = Math.round((r.total + total) * 100) / 100;
    if (o.tags.includes('priority')) r.priority += 1;
  }
  const regions = Object.keys(byRegion).sort().map((k) => ({ region: k, ...byRegion[k] }));
  return { inputBytes: text.length, orders: parsed.orders.length, regions };
};
