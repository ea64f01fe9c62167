import { type CanActivate, type ExecutionContext, Injectable, SetMetadata } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import type { Request } from 'express';
import { ApiKeyAuth } from './api-key-auth';
import type { Principal } from './api-keys/api-keys';
import { Scope } from '@infermesh/proto/gen/infermesh/gateway/v1/api_keys_pb';

const PUBLIC_ROUTE = 'infermesh:public-route';
const REQUIRED_SCOPE = 'infermesh:required-scope';

/** Marks a REST route as open to callers without an API key (the health endpoints). */
export const Public = () => SetMetadata(PUBLIC_ROUTE, true);

/** The scope a REST route (or every route of a controller) needs; unmarked routes need Scope.INFER. */
export const RequireScope = (scope: Scope) => SetMetadata(REQUIRED_SCOPE, scope);

const principals = new WeakMap<Request, Principal>();

/** Who sent a REST request, as ApiKeyGuard authenticated it; only on routes not marked @Public(). */
export function principalOf(req: Request): Principal {
  const principal = principals.get(req);
  if (principal === undefined)
    throw new Error(`no principal on ${req.method} ${req.path}: the route is public or the guard did not run`);
  return principal;
}

/**
 * Requires a valid API key with the route's scope on every REST route not marked @Public(): a
 * missing or unknown key is a 401, a key without the scope a 403. The key's principal is kept with
 * the request for its handler (principalOf).
 */
@Injectable()
export class ApiKeyGuard implements CanActivate {
  constructor(
    private readonly auth: ApiKeyAuth,
    private readonly reflector: Reflector,
  ) {}

  async canActivate(context: ExecutionContext): Promise<boolean> {
    const targets = [context.getHandler(), context.getClass()];
    if (this.reflector.getAllAndOverride<boolean>(PUBLIC_ROUTE, targets)) return true;
    const scope = this.reflector.getAllAndOverride<Scope | undefined>(REQUIRED_SCOPE, targets) ?? Scope.INFER;
    const req = context.switchToHttp().getRequest<Request>();
    principals.set(req, await this.auth.authorize(req.headers.authorization, scope));
    return true;
  }
}
