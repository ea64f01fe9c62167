/** The REST routes, for answering 405 to a known path asked with the wrong method. */
const ROUTES: readonly { pattern: RegExp; methods: readonly string[] }[] = [
  { pattern: /^\/v2\/?$/, methods: ['GET'] },
  { pattern: /^\/v2\/health\/(live|ready)\/?$/, methods: ['GET'] },
  { pattern: /^\/v2\/models\/[^/]+(\/versions\/[^/]+)?\/?$/, methods: ['GET'] },
  { pattern: /^\/v2\/models\/[^/]+(\/versions\/[^/]+)?\/ready\/?$/, methods: ['GET'] },
  { pattern: /^\/v2\/models\/[^/]+(\/versions\/[^/]+)?\/infer\/?$/, methods: ['POST'] },
  { pattern: /^\/v2\/repository\/index\/?$/, methods: ['POST'] },
];

/** The methods a known path accepts, or undefined for a path the gateway does not serve. */
export function allowedMethods(path: string): readonly string[] | undefined {
  const route = ROUTES.find((r) => r.pattern.test(path));
  if (route === undefined) return undefined;
  return route.methods.includes('GET') ? [...route.methods, 'HEAD'] : route.methods;
}
