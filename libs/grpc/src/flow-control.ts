import type { ChannelOptions } from '@grpc/grpc-js';
import type { Http2Server, ServerHttp2Session } from 'node:http2';

/**
 * The HTTP/2 flow-control window, in bytes, of every connection and stream a service receives on,
 * server and client side: how much a peer may send before the receiver has read it.
 *
 * HTTP/2's default is 64 KiB for a connection and for each of its streams, and neither grpc-js
 * server nor client raises it unless told. All calls between two services share one connection, so
 * at 64 KiB a sender stalls for a round trip of the receiver's event loop every 64 KiB: one busy
 * connection of 2 KiB requests then queues them in the sender for seconds while the receiver idles
 * (measured: refusals under 2× overload answered in 3 s through one connection, in tens of ms
 * through another), and a 110 KB tensor waits for a window update mid-message.
 *
 * It must not be larger than what the connection's sockets hold, though. Node's HTTP/2 stops reading
 * a connection while a write to it waits; when both ends write more than the sockets hold at once
 * (requests one way, answers the other), each waits for the other to read and neither does, until
 * the calls' deadlines. With 16 MiB windows, two concurrent unary calls carrying 16 MB each way
 * between two grpc-js processes never finished; at 8 MiB neither did two of four; at 4 MiB or less
 * all did, even 16 calls of 32 MB (this machine: the kernel lets a socket buffer up to 4 MiB of
 * writes, tcp_wmem). 1 MiB keeps a margin below that, as gRPC's Java and Go transports default to.
 * Memory stays bounded by the message size limits and the gateway's body budget, not by this window.
 */
export const FLOW_CONTROL_WINDOW_BYTES = 1024 * 1024;

/** The services' clients' message size limit: their messages carry tensors. */
export const DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024;

/** grpc-js channel (or server) options that let messages of up to `maxBytes` through both ways. */
export function messageLimits(maxBytes = DEFAULT_MAX_MESSAGE_BYTES): ChannelOptions {
  return { 'grpc.max_receive_message_length': maxBytes, 'grpc.max_send_message_length': maxBytes };
}

/** grpc-js channel options that open the window of what a client receives (each stream's and the connection's). */
export const CLIENT_FLOW_CONTROL_OPTIONS = { 'grpc-node.flow_control_window': FLOW_CONTROL_WINDOW_BYTES } as const;

/** Opens the window of what a grpc-js server's HTTP/2 server receives: each stream's (a setting) and each connection's. */
export function openServerWindows(http2Server: Http2Server): void {
  http2Server.updateSettings({ initialWindowSize: FLOW_CONTROL_WINDOW_BYTES });
  http2Server.on('session', (session: ServerHttp2Session) => {
    session.once('localSettings', () => {
      if (!session.destroyed) session.setLocalWindowSize(FLOW_CONTROL_WINDOW_BYTES);
    });
  });
}
