/*
 * veritap's seed gateway for nginx's JavaScript module (njs >= 0.7).
 *
 * A sampled response is verifiable only when its request carries a seed, and
 * real clients do not send one. seed-locations.conf gives the body of each
 * POST to a sampling endpoint to `seededBody`, whose result nginx forwards
 * to the prover (`proxy_set_body`):
 *
 * - a JSON object without a "seed" key gets `"seed":N` inserted right after
 *   its opening brace, N a fresh 63-bit value from the system's CSPRNG; every
 *   other byte of the body is kept as the client sent it;
 * - anything else (a seed already there, even null; an array; text that is
 *   not JSON, or not UTF-8; an empty body) is forwarded unchanged: the server
 *   answers it as before, and the verifier reports it as UNVERIFIABLE(no_seed)
 *   if sampled;
 * - a body nginx kept in a temporary file (client_body_buffer_size smaller
 *   than client_max_body_size) cannot be read here: it is logged as an error
 *   and replaced by an empty body, which the server refuses, so nothing is
 *   answered unseeded by mistake.
 */

/* A uniform integer in [0, 2^63) as decimal digits: njs 0.7 has no BigInt, so
 * the division by ten runs over four 16-bit limbs, most significant first. */
function randomSeed() {
    var words = new Uint32Array(2);
    crypto.getRandomValues(words);
    var limbs = [
        (words[0] >>> 16) & 0x7fff,
        words[0] & 0xffff,
        words[1] >>> 16,
        words[1] & 0xffff,
    ];
    var digits = '';
    while (limbs.some(function (limb) { return limb !== 0; })) {
        var rest = 0;
        for (var i = 0; i < limbs.length; i++) {
            var value = rest * 0x10000 + limbs[i];
            limbs[i] = Math.floor(value / 10);
            rest = value % 10;
        }
        digits = rest + digits;
    }
    return digits || '0';
}

/* The parsed body when it is a JSON object, else null. */
function jsonObject(text) {
    try {
        var value = JSON.parse(text);
    } catch (e) {
        return null;
    }
    if (value === null || typeof value !== 'object' || Array.isArray(value)) {
        return null;
    }
    return value;
}

/* The body as text when it is UTF-8 (a byte order mark kept), else null. */
function utf8Text(bytes) {
    try {
        return new TextDecoder('utf-8', {fatal: true, ignoreBOM: true}).decode(bytes);
    } catch (e) {
        return null;
    }
}

function seededBody(r) {
    var bytes;
    try {
        bytes = r.requestBuffer;
    } catch (e) {
        // Kept in a temporary file: unreadable here. An empty body is refused upstream.
        r.error('veritap seed gateway: request body not in memory (' + e.message + '): '
                + 'client_body_buffer_size must be as large as client_max_body_size; '
                + 'forwarding an empty body, which the server refuses');
        return '';
    }
    if (bytes === undefined) {
        return '';
    }
    var text = utf8Text(bytes);
    var body = text === null ? null : jsonObject(text);
    if (body === null || Object.prototype.hasOwnProperty.call(body, 'seed')) {
        return r.requestText;
    }
    var open = text.indexOf('{') + 1;
    var member = '"seed":' + randomSeed() + (Object.keys(body).length ? ',' : '');
    return text.slice(0, open) + member + text.slice(open);
}

export default {seededBody};
