// Smallest Node.js function: greets the caller.
exports.handler = async (event, context) => {
  const name = (event && event.name) || 'world';
  console.log(`hello ${name} (${context.awsRequestId})`);
  return { message: `Hello, ${name}!`, requestId: context.awsRequestId };
};
