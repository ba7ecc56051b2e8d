package example;

import com.amazonaws.services.lambda.runtime.Context;
import com.amazonaws.services.lambda.runtime.RequestHandler;
import java.util.Map;

/** Smallest Java function: handler "example.Hello". */
public class Hello implements RequestHandler<Map<String, Object>, String> {
    @Override
    public String handleRequest(Map<String, Object> event, Context context) {
        Object name = event == null ? null : event.get("name");
        context.getLogger().log("hello " + name + " (" + context.getAwsRequestId() + ")\n");
        return "Hello, " + (name == null ? "world" : name) + "!";
    }
}
