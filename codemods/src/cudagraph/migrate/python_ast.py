"""An :mod:`ast` tree of any file libcst can read, whatever Python runs the tool.

The rules rewrite libcst trees, and libcst's parser reads the newest grammar it knows (PEP 695 ``type`` aliases and
type parameters, ``match``, PEP 701 f-strings, ``except*``) under every Python it runs on. The cheap checks before
libcst (the rules' quick findings), the post-condition and the project's re-export scan read :mod:`ast` trees, and
:func:`ast.parse` reads only the running interpreter's grammar: a file written for Python 3.12 would not parse under
3.10 or 3.11.

:func:`parse_ast` therefore tries :func:`ast.parse` first (the common case, and the fast one) and, where it fails,
reads the file with libcst and hands :mod:`ast` an equivalent text every supported Python reads: a ``type X = V``
alias becomes ``X = V``, type parameters go, an f-string becomes the tuple of the expressions it formats, an
``except*`` becomes an ``except``. Every name, import, call and attribute keeps its line, which is all the checks
read. A file libcst cannot read either raises the running Python's :class:`SyntaxError`.
"""

from __future__ import annotations

import ast
import symtable
import warnings

import libcst as cst

__all__ = ["parse_ast", "syntax_error"]


def parse_ast(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source)``, or, where the running Python cannot read ``source`` but libcst can, the tree of an
    equivalent text it reads (see the module's docstring). Raises :class:`SyntaxError` when libcst cannot read it
    either."""
    try:
        return ast.parse(source, filename=filename)
    except SyntaxError as error:
        running_error = error
    try:
        tree = cst.parse_module(source)
    except cst.ParserSyntaxError:
        raise running_error from None  # CPython's own message places the error best
    try:
        return ast.parse(tree.visit(_ForOlderGrammars()).code, filename=filename)
    except SyntaxError:
        raise running_error from None


def syntax_error(source: bytes, filename: str = "<unknown>") -> SyntaxError | None:
    """Why neither the running Python nor libcst's grammar reads ``source`` (the running Python's error, which places
    it best), or None when one of them does.

    The common case (it parses) costs the running Python's parser and its symbol table, about half of building the
    :mod:`ast` tree :func:`parse_ast` would build; only a file that fails there is parsed again, by :func:`ast.parse`
    (the symbol table also rejects a few things the grammar accepts, which are not this question) and by libcst (a
    newer grammar than the running Python's: PEP 695 aliases under Python 3.11 parse). A NUL byte, which Python 3.11
    reports as :class:`ValueError`, is a :class:`SyntaxError` here too.
    """
    with warnings.catch_warnings():  # invalid escapes and the like are the file's business, not this run's
        warnings.simplefilter("ignore")
        try:
            symtable.symtable(source, filename, "exec")  # type: ignore[arg-type]  # it reads bytes as compile() does
            return None
        except (SyntaxError, ValueError):
            pass
        try:
            ast.parse(source, filename=filename)
            return None
        except SyntaxError as error:
            running_error = error
        except ValueError as error:  # a NUL byte (3.12 and later raise SyntaxError)
            running_error = SyntaxError(str(error))
    try:
        cst.parse_module(source)
    except Exception:  # libcst raises ParserSyntaxError, or an encoding error for undecodable bytes
        return running_error
    return None


class _ForOlderGrammars(cst.CSTTransformer):
    """Rewrites the constructs newer than the running Python's grammar into ones it reads, keeping every line."""

    def leave_TypeAlias(self, original_node: cst.TypeAlias, updated_node: cst.TypeAlias) -> cst.Assign:
        return cst.Assign(targets=[cst.AssignTarget(updated_node.name)], value=updated_node.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        return updated_node.with_changes(
            type_parameters=None, whitespace_after_type_parameters=cst.SimpleWhitespace("")
        )

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        return updated_node.with_changes(
            type_parameters=None, whitespace_after_type_parameters=cst.SimpleWhitespace("")
        )

    def leave_TryStar(self, original_node: cst.TryStar, updated_node: cst.TryStar) -> cst.Try:
        handlers = [
            cst.ExceptHandler(
                body=handler.body,
                type=handler.type,
                name=handler.name,
                leading_lines=handler.leading_lines,
                whitespace_after_except=cst.SimpleWhitespace(" "),
                whitespace_before_colon=handler.whitespace_before_colon,
            )
            for handler in updated_node.handlers
        ]
        return cst.Try(
            body=updated_node.body,
            handlers=handlers,
            orelse=updated_node.orelse,
            finalbody=updated_node.finalbody,
            leading_lines=updated_node.leading_lines,
        )

    def leave_FormattedString(
        self, original_node: cst.FormattedString, updated_node: cst.FormattedString
    ) -> cst.BaseExpression:
        return _expressions_tuple(original_node, _formatted_expressions(updated_node))

    def leave_ConcatenatedString(
        self, original_node: cst.ConcatenatedString, updated_node: cst.ConcatenatedString
    ) -> cst.BaseExpression:
        if all(
            isinstance(part, (cst.SimpleString, cst.ConcatenatedString))
            for part in (updated_node.left, updated_node.right)
        ):
            return updated_node
        return _expressions_tuple(original_node, [updated_node.left, updated_node.right])


def _formatted_expressions(node: cst.FormattedString) -> list[cst.BaseExpression]:
    found: list[cst.BaseExpression] = []
    for part in node.parts:
        if isinstance(part, cst.FormattedStringExpression):
            found.append(part.expression)
            if part.format_spec:
                found.extend(_formatted_expressions(cst.FormattedString(parts=part.format_spec)))
    return found


def _expressions_tuple(original: cst.CSTNode, expressions: list[cst.BaseExpression]) -> cst.Tuple:
    """``(e1, e2, ...)`` taking as many lines as ``original`` took, so every later line keeps its number."""
    elements = [cst.Element(expression, comma=cst.Comma()) for expression in expressions]
    written = cst.Tuple(elements=elements)
    missing = _code(original).count("\n") - _code(written).count("\n")
    if missing <= 0:
        return written
    closing = cst.RightParen(
        whitespace_before=cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(),
            empty_lines=[cst.EmptyLine(indent=False)] * (missing - 1),
            indent=False,
            last_line=cst.SimpleWhitespace(""),
        )
    )
    return written.with_changes(rpar=[closing])


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)
