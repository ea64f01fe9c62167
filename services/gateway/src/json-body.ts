import { RpcError } from '@infermesh/grpc';
import { BadRequestException, HttpException, HttpStatus, PayloadTooLargeException } from '@nestjs/common';
import type { Request, Response } from 'express';

/**
 * Reads a request body as JSON, at most `maxBytes` of it. A body announced or found larger is
 * refused with 413 before it is buffered, and the connection is closed rather than drained; bad JSON
 * is a 400. An empty body is undefined. Content types are not enforced (curl -d sends a form type).
 */
export async function readJsonBody(req: Request, res: Response, maxBytes: number): Promise<unknown> {
  if (req.headers['inference-header-content-length'] !== undefined) {
    throw new BadRequestException('the binary tensor data extension is not supported; send the request as JSON');
  }
  const encoding = req.headers['content-encoding'];
  if (encoding !== undefined && encoding.toLowerCase() !== 'identity') {
    throw new HttpException(`Content-Encoding "${encoding}" is not supported; send the body uncompressed`, HttpStatus.UNSUPPORTED_MEDIA_TYPE);
  }
  const tooLarge = () => {
    res.setHeader('connection', 'close');
    return new PayloadTooLargeException(`the request body is larger than the ${maxBytes}-byte limit`);
  };
  const announced = Number(req.headers['content-length']);
  if (Number.isFinite(announced) && announced > maxBytes) throw tooLarge();
  const text = await new Promise<string>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let received = 0;
    const cleanup = () => {
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', onError);
      req.off('close', onClose);
    };
    const onData = (chunk: Buffer) => {
      received += chunk.length;
      if (received > maxBytes) {
        cleanup();
        req.pause();
        reject(tooLarge());
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = () => {
      cleanup();
      resolve(Buffer.concat(chunks, received).toString('utf8'));
    };
    const onError = (error: Error) => {
      cleanup();
      reject(new BadRequestException(`the request body could not be read: ${error.message}`));
    };
    const onClose = () => {
      if (!req.complete) onError(new Error('the client closed the connection'));
    };
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
    req.on('close', onClose);
  });
  if (text.trim() === '') return undefined;
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    throw new BadRequestException(`malformed JSON body: ${error instanceof Error ? error.message : String(error)}`);
  }
}

/** The body of a route that takes none: no body, or an empty JSON object; anything else is a 400. */
export async function readNoBody(req: Request, res: Response, maxBytes: number): Promise<void> {
  const body = await readJsonBody(req, res, maxBytes);
  const empty = typeof body === 'object' && body !== null && !Array.isArray(body) && Object.keys(body).length === 0;
  if (body !== undefined && !empty) {
    throw RpcError.invalidArgument('this request takes no body (or an empty JSON object)');
  }
}
