// A minimal out-of-process planner plugin in Node.js, to show the contract is not tied to Python: it loads the
// planner's plugin.proto at run time (no generated code) and serves two stages.
//   OBSERVE: `node_queue_depth`, a fixed value standing in for an external queue the plugin would read.
//   PROPOSE: a decode floor (AT_LEAST) of one engine per 10 queued requests, read from the OBSERVE value the
//            planner passes back in the request, with the tick's time in the reason.
// Usage: node server.js PATH/TO/plugin.proto [host:port]   (prints "port N" once serving)
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const [protoPath, listen = '127.0.0.1:50062'] = process.argv.slice(2);
const definition = loader.loadSync(protoPath, {keepCase: true, defaults: false, oneofs: true});
const v1 = grpc.loadPackageDefinition(definition).dynamo.planner.plugin.v1;
const QUEUE_DEPTH = 77;

const server = new grpc.Server();
server.addService(v1.ObservePlugin.service, {
  Observe: (call, reply) => reply(null, {values: {node_queue_depth: QUEUE_DEPTH}, reason: 'node queue feed'}),
});
server.addService(v1.ProposePlugin.service, {
  Propose: (call, reply) => {
    const context = call.request.context;
    const depth = ((context.observations || {}).plugin_values || {}).node_queue_depth;
    if (depth === undefined) {
      reply(null, {accept: {}}); // the feed did not answer this tick: no opinion
      return;
    }
    const target = {sub_component_type: 'decode', replicas: Math.ceil(depth / 10), type: 'AT_LEAST'};
    reply(null, {override: {targets: [target], reason: `queue ${depth} at t=${context.tick_time_s}`}});
  },
});
server.bindAsync(listen, grpc.ServerCredentials.createInsecure(), (error, port) => {
  if (error) throw error;
  console.log(`port ${port}`);
});
