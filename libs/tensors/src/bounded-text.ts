/** The most characters of a name that a message quotes. */
export const MAX_QUOTED_NAME_CHARS = 64;
/**
 * The text, or its first `maxChars` characters followed by `…(N bytes)` saying how long it was: a
 * client's name or text quoted in a message can never make the message large.
 */
export function boundedText(text: string, maxChars: number): string {
  if (text.length <= maxChars) return text;
  return `${text.slice(0, maxChars)}…(${Buffer.byteLength(text, 'utf8')} bytes)`;
}

/** A name as messages quote it: `"name"`, at most MAX_QUOTED_NAME_CHARS of it. */
export function quoted(name: string): string {
  return `"${boundedText(name, MAX_QUOTED_NAME_CHARS)}"`;
}
