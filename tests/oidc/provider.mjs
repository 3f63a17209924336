// An OpenID Provider for chime's tests, set up as a company's would be: the npm package
// `oidc-provider` (OpenID Certified), with chime as a confidential client that must use
// PKCE, a `groups` claim in the ID token, its own sign-in page with a password per account,
// and consent implied for the company's own apps. tests/setup.sh installs the package
// (pinned) under target/oidc-provider; tests/api/oidc.rs starts this script.
//
// Environment: OIDC_PROVIDER_MODULE (the package's directory), CHIME_CALLBACK (chime's
// redirect URI), OIDC_PROVIDER_KEY_FILE (optional: where its signing key is kept). It listens on a free port of 127.0.0.1 and prints its issuer URL as its
// first line.
//
// For the tests, beside the provider's own endpoints: POST /test/mode?set=… makes the
// token endpoint misbehave as a test needs (`wrong-audience`: the ID token is the one the
// provider issues to another client, `other-app`; `expired`: an ID token that lives one
// second, sent two seconds late; `other-nonce`: an ID token it signed with another sign-in's
// nonce; `tampered`: its ID token with a group added after signing; `hold`: the redirect back to chime is a page with a link,
// `#continue`, for the test to read and edit; `normal`), and GET /test/last-callback answers the last
// redirect to chime that the provider made (with its code and state), for a replay.

import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import { pathToFileURL } from 'node:url';

const { default: Provider } = await import(pathToFileURL(`${process.env.OIDC_PROVIDER_MODULE}/lib/index.js`).href);
const callback = process.env.CHIME_CALLBACK;
if (!callback) throw new Error('CHIME_CALLBACK: chime\'s redirect URI is needed');

// The company's staff: a password each, and the groups the directory puts them in.
const accounts = {
  alice: { password: 'alice-password', name: 'Alice Admin', email: 'alice@example.com', groups: ['staff', 'chime-admins'] },
  sam: { password: 'sam-password', name: 'Sam Support', email: 'sam@example.com', groups: ['staff', 'chime-support'] },
  nora: { password: 'nora-password', name: 'Nora Marketing', email: 'nora@example.com', groups: ['staff', 'marketing'] },
};
// Subjects are opaque and stable, as a directory's ids are; not the user names.
const subject = (login) => `employee-${Buffer.from(login).toString('hex')}`;
const bySubject = Object.fromEntries(Object.keys(accounts).map((login) => [subject(login), login]));

// A signing key of its own (RS256, as most providers sign), kept in OIDC_PROVIDER_KEY_FILE
// when given: making an RSA key takes seconds on a loaded machine, once is enough.
function signingKey() {
  const file = process.env.OIDC_PROVIDER_KEY_FILE;
  if (file && fs.existsSync(file)) return JSON.parse(fs.readFileSync(file, 'utf8'));
  const made = { ...crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ format: 'jwk' }), kid: crypto.randomUUID() };
  if (file) {
    fs.writeFileSync(`${file}.${process.pid}`, JSON.stringify(made), { mode: 0o600 });
    fs.renameSync(`${file}.${process.pid}`, file);
  }
  return made;
}
const jwks = { keys: [{ ...signingKey(), use: 'sig', alg: 'RS256' }] };

let mode = 'normal';
let lastCallback = '';

const server = http.createServer();
await new Promise((resolve) => { server.listen(0, '127.0.0.1', resolve); });
const issuer = `http://127.0.0.1:${server.address().port}`;

async function findAccount(ctx, id) {
  const login = bySubject[id];
  if (!login) return undefined;
  const a = accounts[login];
  return { accountId: id, claims: () => ({ sub: id, preferred_username: login, name: a.name, email: a.email, groups: a.groups }) };
}

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: 'chime',
      client_secret: 'chime-client-secret',
      redirect_uris: [callback],
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    },
    // Another of the company's apps, whose tokens chime must refuse.
    {
      client_id: 'other-app',
      client_secret: 'other-app-secret',
      redirect_uris: [callback],
      grant_types: ['authorization_code'],
      response_types: ['code'],
    },
  ],
  jwks,
  pkce: { required: () => true },
  scopes: ['openid', 'profile', 'email', 'groups'],
  claims: { openid: ['sub'], profile: ['name', 'preferred_username'], email: ['email'], groups: ['groups'] },
  // The ID token carries the claims its scopes ask for, as company providers' do.
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: false } },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  cookies: { keys: ['chime-test-provider-cookie-key'] },
  ttl: { IdToken: () => (mode === 'expired' ? 1 : 3600) },
  findAccount,
});

// What the tests ask of the token endpoint, and the last redirect back to chime.
provider.use(async (ctx, next) => {
  await next();
  const location = ctx.response.get('Location');
  if (location && location.startsWith(callback)) {
    lastCallback = location;
    if (mode === 'hold') {
      ctx.remove('Location');
      ctx.status = 200;
      ctx.type = 'text/html; charset=utf-8';
      ctx.body = page(`<p><a id="continue" href="${escape(location)}">Continue to chime</a></p>`);
    }
  }
  if (ctx.path === '/token' && ctx.status === 200 && ctx.body && ctx.body.id_token) {
    if (mode === 'wrong-audience') {
      const claims = JSON.parse(Buffer.from(ctx.body.id_token.split('.')[1], 'base64url'));
      const other = await provider.Client.find('other-app');
      const account = await findAccount(ctx, claims.sub);
      const token = new provider.IdToken(await account.claims('id_token', 'openid profile email groups', {}, []), { ctx, client: other });
      token.scope = 'openid profile email groups';
      token.set('nonce', claims.nonce);
      ctx.body.id_token = await token.issue({ use: 'idtoken' });
    } else if (mode === 'expired') {
      await new Promise((resolve) => { setTimeout(resolve, 2000); });
    } else if (mode === 'other-nonce' || mode === 'tampered') {
      const [header, payload, signature] = ctx.body.id_token.split('.');
      const claims = JSON.parse(Buffer.from(payload, 'base64url'));
      if (mode === 'other-nonce') {
        // Signed by the provider, for another sign-in of chime's.
        claims.nonce = 'the-nonce-of-another-sign-in';
        const signed = `${header}.${Buffer.from(JSON.stringify(claims)).toString('base64url')}`;
        const key = crypto.createPrivateKey({ key: jwks.keys[0], format: 'jwk' });
        ctx.body.id_token = `${signed}.${crypto.sign('sha256', Buffer.from(signed), key).toString('base64url')}`;
      } else {
        // Changed after the provider signed it: a group added.
        claims.groups = [...(claims.groups || []), 'chime-admins'];
        ctx.body.id_token = `${header}.${Buffer.from(JSON.stringify(claims)).toString('base64url')}.${signature}`;
      }
    }
  }
});

const page = (body) => `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Example Corp sign-in</title></head>
<body><main><h1>Example Corp</h1>${body}</main></body></html>`;
const escape = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const loginForm = (uid, error) => page(`${error ? `<p id="error">${escape(error)}</p>` : ''}
<form id="idp-login" method="post" action="/interaction/${uid}/login">
<label>User name <input name="username" autocomplete="username"></label>
<label>Password <input name="password" type="password" autocomplete="current-password"></label>
<button type="submit">Sign in</button></form>`);

async function readForm(req) {
  let body = '';
  for await (const chunk of req) body += chunk;
  return new URLSearchParams(body);
}

function send(res, status, type, body) {
  res.writeHead(status, { 'content-type': type });
  res.end(body);
}

// The provider's sign-in page (the login prompt) and consent, implied for the company's apps.
async function interaction(req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  if (details.prompt.name === 'login') {
    if (req.method === 'POST' && action === 'login') {
      const form = await readForm(req);
      const login = form.get('username');
      const account = accounts[login];
      if (!account || account.password !== form.get('password')) {
        send(res, 200, 'text/html; charset=utf-8', loginForm(uid, 'Wrong user name or password.'));
        return;
      }
      await provider.interactionFinished(req, res, { login: { accountId: subject(login) } }, { mergeWithLastSubmission: false });
      return;
    }
    send(res, 200, 'text/html; charset=utf-8', loginForm(uid));
    return;
  }
  const { prompt: { details: missing }, params, session: { accountId } } = details;
  const grant = details.grantId ? await provider.Grant.find(details.grantId) : new provider.Grant({ accountId, clientId: params.client_id });
  if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
  if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
  const grantId = await grant.save();
  await provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
}

const handle = provider.callback();
server.on('request', async (req, res) => {
  const url = new URL(req.url, issuer);
  try {
    if (url.pathname === '/test/mode' && req.method === 'POST') {
      mode = url.searchParams.get('set') || 'normal';
      send(res, 200, 'text/plain', mode);
    } else if (url.pathname === '/test/last-callback') {
      send(res, 200, 'text/plain', lastCallback);
    } else if (url.pathname.startsWith('/interaction/')) {
      const [, , uid, action] = url.pathname.split('/');
      await interaction(req, res, uid, action);
    } else {
      handle(req, res);
    }
  } catch (e) {
    console.error(e);
    if (!res.headersSent) send(res, 500, 'text/plain', String(e));
  }
});

console.log(issuer);
