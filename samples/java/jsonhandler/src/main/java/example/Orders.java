package example;

import com.amazonaws.services.lambda.runtime.Context;
import com.amazonaws.services.lambda.runtime.RequestHandler;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.SerializationFeature;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * POJO in/out (mapped by the runtime), plus the function's own Jackson (bundled in lib/) for a
 * canonical JSON digest. Handler "example.Orders".
 */
public class Orders implements RequestHandler<Orders.Request, Orders.Summary> {
    private static final ObjectMapper MAPPER = new ObjectMapper().enable(SerializationFeature.ORDER_MAP_ENTRIES_BY_KEYS);

    public static class Item {
        public String sku;
        public int qty;
        public double price;
    }

    public static class Order {
        public String id;
        public String region;
        public List<Item> items = new ArrayList<>();
    }

    public static class Request {
        private List<Order> orders = new ArrayList<>();
        private int generate;

        public List<Order> getOrders() { return orders; }
        public void setOrders(List<Order> orders) { this.orders = orders; }
        public int getGenerate() { return generate; }
        public void setGenerate(int generate) { this.generate = generate; }
    }

    public static class Summary {
        public int orders;
        public Map<String, Double> totalByRegion = new TreeMap<>();
        public String canonical;
    }

    @Override
    public Summary handleRequest(Request req, Context ctx) {
        List<Order> orders = req.getOrders();
        for (int i = 0; i < req.getGenerate(); i++) {
            Order o = new Order();
            o.id = "gen-" + i;
            o.region = new String[] {"north", "south", "east"}[i % 3];
            Item it = new Item();
            it.sku = "sku-" + (i % 7);
            it.qty = 1 + i % 4;
            it.price = 2.5 + i % 5;
            o.items.add(it);
            orders.add(o);
        }
        Summary s = new Summary();
        s.orders = orders.size();
        for (Order o : orders) {
            double t = 0;
            for (Item it : o.items) {
                t += it.qty * it.price;
            }
            s.totalByRegion.merge(o.region, t, Double::sum);
        }
        try {
            String text = MAPPER.writeValueAsString(s.totalByRegion);
            s.canonical = text.length() > 200 ? text.substring(0, 200) : text;
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
        return s;
    }
}
