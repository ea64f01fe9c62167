import { Errors } from '@infermesh/grpc';
import type { Request, Response } from 'express';
import type { BodyBudget } from './body-budget';

/** Triton's binary tensor data extension: the length of the JSON header that starts the body. */
export const INFERENCE_HEADER_LENGTH = 'inference-header-content-length';

/** What bounds a body: its own size (GATEWAY_MAX_BODY_BYTES), and the bytes of all bodies held at once (GATEWAY_MAX_BODY_BYTES_IN_FLIGHT). */
export interface BodyLimits {
  maxBytes: number;
  budget: BodyBudget;
}

/**
 * Reads a request body as JSON, at most `limits.maxBytes` of it. A body announced or found larger is
 * refused with 413 before it is buffered, and the connection is closed rather than drained; one that
 * does not fit the budget of bodies in flight is refused with 429 the same way; bad JSON is a 400. An empty body is undefined. Content types are not enforced (curl -d sends a form type).
 * Only inference takes the binary tensor data extension (readInferBody).
 */
export async function readJsonBody(req: Request, res: Response, limits: BodyLimits): Promise<unknown> {
  if (req.headers[INFERENCE_HEADER_LENGTH] !== undefined) {
    throw Errors.invalidRequest(
      'Inference-Header-Content-Length (binary tensor data) is for inference requests only; send this body as JSON',
    );
  }
  return parseJson((await readBody(req, res, limits)).toString('utf8'), 'body');
}

/** An inference body: its JSON, and the binary tensor data after it when the request uses that extension. */
export interface InferBody {
  json: unknown;
  /** The bytes after the JSON header, undefined without Inference-Header-Content-Length. */
  binaryData: Buffer | undefined;
}

/**
 * Reads an inference request body: JSON, as readJsonBody, or with `Inference-Header-Content-Length: N`
 * (Triton's binary tensor data extension) a JSON header of N bytes followed by the inputs' binary
 * data. N must be a non-negative integer no larger than the body; `limits` bound the whole body.
 */
export async function readInferBody(req: Request, res: Response, limits: BodyLimits): Promise<InferBody> {
  const header = req.headers[INFERENCE_HEADER_LENGTH];
  if (header === undefined) return { json: await readJsonBody(req, res, limits), binaryData: undefined };
  const text = (Array.isArray(header) ? header.join(',') : header).trim();
  const headerLength = /^\d{1,15}$/.test(text) ? Number(text) : NaN;
  if (!Number.isSafeInteger(headerLength)) {
    throw Errors.invalidRequest(
      `Inference-Header-Content-Length must be a non-negative integer of bytes, got ${JSON.stringify(text.slice(0, 40))}`,
    );
  }
  const body = await readBody(req, res, limits);
  if (headerLength > body.length) {
    throw Errors.invalidRequest(
      `Inference-Header-Content-Length is ${headerLength} but the body has only ${body.length} bytes`,
    );
  }
  const json = parseJson(body.toString('utf8', 0, headerLength), 'inference header');
  if (json === undefined)
    throw Errors.invalidRequest(
      `the inference header (the first ${headerLength} bytes of the body) is empty; it must be a JSON object`,
    );
  return { json, binaryData: body.subarray(headerLength) };
}

function parseJson(text: string, what: string): unknown {
  if (text.trim() === '') return undefined;
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    throw Errors.malformedMessage(`malformed JSON ${what}: ${error instanceof Error ? error.message : String(error)}`);
  }
}

/**
 * The whole body, at most `maxBytes` (413 beyond, announced or streamed); 415 for a compressed one.
 * Its bytes are taken from the budget as they arrive, all at once when Content-Length announces them
 * (429 when they do not fit), and given back when the response is done. It must arrive whole within
 * the budget's receive timeout (408 after it, the connection closed).
 */
async function readBody(req: Request, res: Response, { maxBytes, budget }: BodyLimits): Promise<Buffer> {
  const encoding = req.headers['content-encoding'];
  if (encoding !== undefined && encoding.toLowerCase() !== 'identity') {
    throw Errors.unsupportedMediaType(`Content-Encoding "${encoding}" is not supported; send the body uncompressed`);
  }
  const tooLarge = () => {
    res.setHeader('connection', 'close');
    return Errors.payloadTooLarge(
      `the request body is larger than the ${maxBytes}-byte limit (GATEWAY_MAX_BODY_BYTES)`,
      {
        metadata: { limit: 'GATEWAY_MAX_BODY_BYTES' },
      },
    );
  };
  const announced = Number(req.headers['content-length']);
  if (Number.isFinite(announced) && announced > maxBytes) throw tooLarge();
  let reserved = Number.isSafeInteger(announced) && announced > 0 ? announced : 0;
  const reservation = budget.reserve(reserved);
  if (res.closed)
    reservation.release(); // the client is gone already; reading fails below
  else res.once('close', () => reservation.release());
  return new Promise<Buffer>((resolve, reject) => {
    // A body of announced size is copied into one buffer as it arrives: it is never held twice.
    const whole = reserved > 0 ? Buffer.allocUnsafe(reserved) : undefined;
    const chunks: Buffer[] = [];
    let received = 0;
    const cleanup = () => {
      arrived();
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', onError);
      req.off('close', onClose);
    };
    const refuse = (error: Error) => {
      cleanup();
      req.pause();
      res.setHeader('connection', 'close');
      reject(error);
    };
    const onData = (chunk: Buffer) => {
      received += chunk.length;
      if (received > maxBytes) {
        refuse(tooLarge());
        return;
      }
      if (received > reserved) {
        try {
          reservation.grow(received - reserved);
        } catch (error) {
          refuse(error as Error);
          return;
        }
        reserved = received;
      }
      if (whole !== undefined && received <= whole.length) chunk.copy(whole, received - chunk.length);
      else chunks.push(chunk);
    };
    const onEnd = () => {
      cleanup();
      resolve(
        whole !== undefined && chunks.length === 0
          ? whole.subarray(0, received)
          : Buffer.concat(whole === undefined ? chunks : [whole, ...chunks], received),
      );
    };
    const onError = (error: Error) => {
      cleanup();
      reject(Errors.invalidRequest(`the request body could not be read: ${error.message}`));
    };
    const onClose = () => {
      if (!req.complete) onError(new Error('the client closed the connection'));
    };
    const arrived = budget.watchArrival(req, refuse);
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
    req.on('close', onClose);
  });
}

/** The body of a route that takes none: no body, or an empty JSON object; anything else is a 400. */
export async function readNoBody(req: Request, res: Response, limits: BodyLimits): Promise<void> {
  const body = await readJsonBody(req, res, limits);
  const empty = typeof body === 'object' && body !== null && !Array.isArray(body) && Object.keys(body).length === 0;
  if (body !== undefined && !empty) {
    throw Errors.invalidRequest('this request takes no body (or an empty JSON object)');
  }
}
