import { type CanActivate, type ExecutionContext, Injectable, SetMetadata } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import type { Request } from 'express';
import { ApiKeyAuth } from './api-key-auth';

const PUBLIC_ROUTE = 'infermesh:public-route';

/** Marks a REST route as open to callers without an API key (the health endpoints). */
export const Public = () => SetMetadata(PUBLIC_ROUTE, true);

/** Requires a valid API key on every REST route not marked @Public(); a failure is a 401. */
@Injectable()
export class ApiKeyGuard implements CanActivate {
  constructor(
    private readonly auth: ApiKeyAuth,
    private readonly reflector: Reflector,
  ) {}

  canActivate(context: ExecutionContext): boolean {
    if (this.reflector.getAllAndOverride<boolean>(PUBLIC_ROUTE, [context.getHandler(), context.getClass()])) return true;
    this.auth.verify(context.switchToHttp().getRequest<Request>().headers.authorization);
    return true;
  }
}
