/** The REST routes, for answering 405 to a known path asked with the wrong method. */
const ROUTES: readonly { pattern: RegExp; methods: readonly string[] }[] = [
  { pattern: /^\/v2\/?$/, methods: ['GET'] },
  { pattern: /^\/v2\/health\/(live|ready)\/?$/, methods: ['GET'] },
  { pattern: /^\/v2\/models\/[^/]+(\/versions\/[^/]+)?\/?$/, methods: ['GET'] },
  { pattern: /^\/v2\/models\/[^/]+(\/versions\/[^/]+)?\/ready\/?$/, methods: ['GET'] },
  { pattern: /^\/v2\/models\/[^/]+(\/versions\/[^/]+)?\/infer\/?$/, methods: ['POST'] },
  { pattern: /^\/v2\/repository\/index\/?$/, methods: ['POST'] },
  { pattern: /^\/v2\/repository\/models\/[^/]+\/(load|unload)\/?$/, methods: ['POST'] },
  { pattern: /^\/admin\/v1\/models\/?$/, methods: ['GET'] },
  { pattern: /^\/admin\/v1\/models\/[^/]+\/?$/, methods: ['GET', 'PATCH', 'DELETE'] },
  { pattern: /^\/admin\/v1\/artifacts\/?$/, methods: ['POST'] },
  { pattern: /^\/admin\/v1\/models\/[^/]+\/versions\/?$/, methods: ['POST'] },
  { pattern: /^\/admin\/v1\/models\/[^/]+\/versions\/[^/]+\/retire\/?$/, methods: ['POST'] },
  { pattern: /^\/admin\/v1\/models\/[^/]+\/(rollout|cache)\/?$/, methods: ['PUT'] },
  {
    pattern: /^\/admin\/v1\/models\/[^/]+\/rollout\/(promote|rollback|weights|pause|auto|auto\/resume)\/?$/,
    methods: ['POST'],
  },
  { pattern: /^\/admin\/v1\/api-keys\/?$/, methods: ['GET', 'POST'] },
  { pattern: /^\/admin\/v1\/api-keys\/[^/]+\/revoke\/?$/, methods: ['POST'] },
];

/** The methods a known path accepts, or undefined for a path the gateway does not serve. */
export function allowedMethods(path: string): readonly string[] | undefined {
  const route = ROUTES.find((r) => r.pattern.test(path));
  if (route === undefined) return undefined;
  return route.methods.includes('GET') ? [...route.methods, 'HEAD'] : route.methods;
}
