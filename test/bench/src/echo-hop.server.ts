import * as grpc from '@grpc/grpc-js';
import { tuneHeapForTensors } from '@infermesh/config';
import { CLIENT_FLOW_CONTROL_OPTIONS, messageLimits, onHttp2Servers, openServerWindows } from '@infermesh/grpc';
import { sanitizeRequestId } from '@infermesh/telemetry';

/**
 * One hop of the path benchmark's transport floor, a process of its own as each service is: a bare
 * grpc-js server (identity serializers: no protobuf, no interceptors, no logging or metrics) with one
 * unary method, its path argv[2] (the benchmark gives the real method's, so that headers weigh the
 * same). With a next hop (argv[3], host:port) it passes each request's bytes on to it unchanged and
 * answers with what it answers; the last hop (argv[3] '-') answers every request with argv[4] bytes
 * (built once). A chain of them carries the bytes a request and its answer carry through the
 * services, across as many hops, and costs what grpc-js and HTTP/2 cost for them, and nothing else.
 * It runs with the services' V8 settings (tuneHeapForTensors) and their HTTP/2 windows, receiving
 * as a server and as a client (with HTTP/2's default 64 KiB, a 110 KiB request stopped at each hop for
 * a window update the services' hops do not wait for). Sends its port to the parent over IPC; ends
 * when the parent disconnects.
 *
 * With argv[5] 'context', each hop passes on what a call between the services carries beside its
 * bytes, and nothing else: its deadline (grpc-timeout, from the call it received) and a request id
 * (x-request-id: the one it received, or a new one, as the services' sanitizeRequestId does), in place of the caller's
 * metadata. Without it, the caller's metadata is passed on as it came, and no deadline.
 */
const identity = (bytes: Buffer) => bytes;

/** What a hop in 'context' mode passes on: the call's deadline and request id. */
function callContext(call: grpc.ServerUnaryCall<Buffer, Buffer>): {
  metadata: grpc.Metadata;
  options: grpc.CallOptions;
} {
  const metadata = new grpc.Metadata();
  const [received] = call.metadata.get('x-request-id');
  metadata.set('x-request-id', sanitizeRequestId(typeof received === 'string' ? received : undefined));
  return { metadata, options: { deadline: call.getDeadline() } };
}

function main(): void {
  tuneHeapForTensors();
  const [method, nextAddress, answerBytes, mode] = process.argv.slice(2) as [string, string, string, string?];
  const withContext = mode === 'context';
  const next =
    nextAddress === '-'
      ? undefined
      : new grpc.Client(nextAddress, grpc.credentials.createInsecure(), {
          ...messageLimits(),
          ...CLIENT_FLOW_CONTROL_OPTIONS,
        });
  const answer = Buffer.alloc(Number(answerBytes));
  const server = new grpc.Server(messageLimits());
  onHttp2Servers(server, openServerWindows);
  server.register<Buffer, Buffer>(
    method,
    (call: grpc.ServerUnaryCall<Buffer, Buffer>, callback: grpc.sendUnaryData<Buffer>) => {
      if (next === undefined) {
        callback(null, answer);
        return;
      }
      const { metadata, options } = withContext ? callContext(call) : { metadata: call.metadata, options: {} };
      next.makeUnaryRequest(method, identity, identity, call.request, metadata, options, (error, response) =>
        callback(error, response),
      );
    },
    identity,
    identity,
    'unary',
  );
  server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (error, port) => {
    if (error !== null) throw error;
    process.send?.({ port });
  });
  process.on('disconnect', () => {
    next?.close();
    server.forceShutdown();
    process.exit(0);
  });
}

main();
